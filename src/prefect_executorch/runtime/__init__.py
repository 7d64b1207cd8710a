"""Running a bundle as its consumer does: the loaded program, the LLM runner and the one-token driver, the speech
transcriber, the bundled cases and the C++ consumer. ``verify``, ``pull --verify``, ``generate``, ``transcribe``, the
side-by-side and validation all run programs through here; ``validate/`` judges what they produce."""
