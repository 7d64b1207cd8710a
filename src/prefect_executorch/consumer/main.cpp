// A bundle's C++ consumer: loads model.pte (with its .ptd data files) through ExecuTorch's Module, runs every case
// of CASES_DIR/cases.txt (written by prefect-executorch from the bundle's model.bpte) and compares each output with
// the expected one at the bundle's tolerances. One line per case, then a verdict.
// Exit codes: 0 every case matches, 1 a case mismatched or failed to run, 2 the program or a method did not load,
// 3 bad arguments or case files. With BUNDLE_CONSUMER_TIME_CALLS=N, each matching case is then called N
// more times (after one warm call) and a line "time METHOD LABEL p50_us=..." gives the median call.
#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

using executorch::aten::ScalarType;
using executorch::aten::SizesType;
using executorch::extension::Module;
using executorch::runtime::Error;
using executorch::runtime::EValue;

namespace {

struct TensorFile {
  ScalarType type;
  std::vector<SizesType> sizes;
  std::vector<char> bytes;
};

struct Case {
  std::string method;
  std::string label;
  double atol = -1, rtol = -1, min_cosine = -1, max_rel_error = -1;  // -1: not held to it
  std::vector<TensorFile> inputs, expected;
};

bool scalar_type(const std::string& name, ScalarType* type) {
  static const std::pair<const char*, ScalarType> known[] = {
      {"float32", ScalarType::Float}, {"float16", ScalarType::Half}, {"bfloat16", ScalarType::BFloat16},
      {"float64", ScalarType::Double}, {"int64", ScalarType::Long}, {"int32", ScalarType::Int},
      {"int8", ScalarType::Char}, {"uint8", ScalarType::Byte}, {"bool", ScalarType::Bool}};
  for (const auto& [text, value] : known) {
    if (name == text) {
      *type = value;
      return true;
    }
  }
  return false;
}

// "<dtype> <file> <dim>..." -> the tensor's type, sizes and bytes.
bool read_tensor(std::istringstream& line, const std::string& dir, TensorFile* out) {
  std::string dtype, file;
  if (!(line >> dtype >> file) || !scalar_type(dtype, &out->type)) return false;
  for (SizesType dim; line >> dim;) out->sizes.push_back(dim);
  std::ifstream data(dir + "/" + file, std::ios::binary);
  if (!data) return false;
  out->bytes.assign(std::istreambuf_iterator<char>(data), std::istreambuf_iterator<char>());
  return true;
}

bool read_cases(const std::string& dir, std::vector<Case>* cases) {
  std::ifstream index(dir + "/cases.txt");
  if (!index) return false;
  for (std::string text; std::getline(index, text);) {
    std::istringstream line(text);
    std::string kind;
    line >> kind;
    if (kind == "case") {
      Case next;
      if (!(line >> next.method >> next.label >> next.atol >> next.rtol >> next.min_cosine >> next.max_rel_error))
        return false;
      cases->push_back(next);
    } else if ((kind == "in" || kind == "out") && !cases->empty()) {
      TensorFile tensor;
      if (!read_tensor(line, dir, &tensor)) return false;
      (kind == "in" ? cases->back().inputs : cases->back().expected).push_back(std::move(tensor));
    } else if (!kind.empty()) {
      return false;
    }
  }
  return !cases->empty();
}

double element(const void* data, ScalarType type, size_t i) {
  switch (type) {
    case ScalarType::Float: return static_cast<const float*>(data)[i];
    case ScalarType::Double: return static_cast<const double*>(data)[i];
    case ScalarType::Half: return static_cast<float>(static_cast<const executorch::aten::Half*>(data)[i]);
    case ScalarType::BFloat16: return static_cast<float>(static_cast<const executorch::aten::BFloat16*>(data)[i]);
    case ScalarType::Long: return static_cast<double>(static_cast<const int64_t*>(data)[i]);
    case ScalarType::Int: return static_cast<const int32_t*>(data)[i];
    case ScalarType::Char: return static_cast<const int8_t*>(data)[i];
    case ScalarType::Byte: return static_cast<const uint8_t*>(data)[i];
    case ScalarType::Bool: return static_cast<const bool*>(data)[i];
    default: return NAN;
  }
}

// Empty when the output matches; else why not. The rules of prefect-executorch's bundled check:
// |out - expected| <= atol + rtol * |expected| element-wise, then the cosine floor and relative error if held.
std::string compare(const executorch::aten::Tensor& got, const TensorFile& want, const Case& c, double* worst) {
  if (got.scalar_type() != want.type) return "output type differs from the expected one";
  size_t count = 1;
  for (SizesType dim : want.sizes) count *= dim;
  if (static_cast<size_t>(got.numel()) != count) return "output has " + std::to_string(got.numel()) +
                                                   " elements, expected " + std::to_string(count);
  double dot = 0, got_norm = 0, want_norm = 0, diff_norm = 0;
  bool within = true;
  for (size_t i = 0; i < count; ++i) {
    double a = element(got.const_data_ptr(), got.scalar_type(), i);
    double e = element(want.bytes.data(), want.type, i);
    double error = std::fabs(a - e);
    if (std::isnan(a) && std::isnan(e)) error = 0;
    *worst = std::max(*worst, error);
    if (c.atol >= 0 && !(error <= c.atol + std::max(c.rtol, 0.0) * std::fabs(e))) within = false;
    dot += a * e, got_norm += a * a, want_norm += e * e, diff_norm += (a - e) * (a - e);
  }
  if (!within) return "beyond atol=" + std::to_string(c.atol) + " + rtol=" + std::to_string(c.rtol) + "*|expected|";
  double norms = std::sqrt(got_norm * want_norm);
  double cosine = norms > 0 ? dot / norms : (diff_norm == 0 ? 1.0 : 0.0);
  if (c.min_cosine >= 0 && cosine < c.min_cosine) return "cosine similarity " + std::to_string(cosine) + " < " +
                                                         std::to_string(c.min_cosine);
  double rel = want_norm > 0 ? std::sqrt(diff_norm / want_norm) : (diff_norm == 0 ? 0.0 : 1.0);
  if (c.max_rel_error >= 0 && rel > c.max_rel_error) return "relative error " + std::to_string(rel) + " > " +
                                                            std::to_string(c.max_rel_error);
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: bundle_consumer PROGRAM.pte CASES_DIR [DATA.ptd...]\n";
    return 3;
  }
  std::vector<Case> cases;
  if (!read_cases(argv[2], &cases)) {
    std::cerr << "error: cannot read the cases in " << argv[2] << "/cases.txt\n";
    return 3;
  }
  std::vector<std::string> data_files(argv + 3, argv + argc);
  const char* timing = std::getenv("BUNDLE_CONSUMER_TIME_CALLS");
  const long time_calls = timing ? std::strtol(timing, nullptr, 10) : 0;
  Module module(argv[1], data_files);
  if (Error loaded = module.load(); loaded != Error::Ok) {
    std::printf("LOAD ERROR: %s did not load: %s (0x%x)\n", argv[1], executorch::runtime::to_string(loaded),
                static_cast<unsigned>(loaded));
    return 2;
  }
  int failed = 0;
  std::string loaded_methods;
  for (const Case& c : cases) {
    if (loaded_methods.find("|" + c.method + "|") == std::string::npos) {
      Error error = module.load_method(c.method);
      if (error != Error::Ok) {
        // The runtime has logged what it lacked (e.g. "Missing operator: ... quantized_decomposed::embedding_4bit.out").
        std::printf("LOAD ERROR: method %s did not load: %s (0x%x)%s\n", c.method.c_str(),
                    executorch::runtime::to_string(error), static_cast<unsigned>(error),
                    error == Error::OperatorMissing ? ": an operator the linked kernels lack (named in the log above)"
                    : error == Error::NotFound ? ": a backend or data the program needs is not linked or given" : "");
        return 2;
      }
      loaded_methods += "|" + c.method + "|";
    }
    std::vector<EValue> inputs;
    std::vector<executorch::extension::TensorPtr> held;
    for (TensorFile& input : const_cast<Case&>(c).inputs) {
      held.push_back(executorch::extension::from_blob(input.bytes.data(), input.sizes, input.type));
      inputs.emplace_back(*held.back());
    }
    auto outputs = module.execute(c.method, inputs);
    std::string why;
    double worst = 0;
    if (!outputs.ok()) {
      why = std::string("execution failed: ") + executorch::runtime::to_string(outputs.error());
    } else if (outputs->size() != c.expected.size()) {
      why = std::to_string(outputs->size()) + " outputs, expected " + std::to_string(c.expected.size());
    } else {
      for (size_t i = 0; i < c.expected.size() && why.empty(); ++i) {
        if (!(*outputs)[i].isTensor()) {
          why = "output " + std::to_string(i) + " is no tensor";
        } else if (std::string found = compare((*outputs)[i].toTensor(), c.expected[i], c, &worst); !found.empty()) {
          why = "output " + std::to_string(i) + ": " + found;
        }
      }
    }
    std::printf("%s %s %s: max abs error %.3g%s%s\n", why.empty() ? "ok" : "MISMATCH", c.method.c_str(),
                c.label.c_str(), worst, why.empty() ? "" : ": ", why.c_str());
    failed += !why.empty();
    if (why.empty() && time_calls > 0) {
      std::vector<double> micros;
      module.execute(c.method, inputs);  // warm
      for (long i = 0; i < time_calls; ++i) {
        auto start = std::chrono::steady_clock::now();
        auto result = module.execute(c.method, inputs);
        micros.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
        if (!result.ok()) return 1;
      }
      std::sort(micros.begin(), micros.end());
      std::printf("time %s %s p50_us=%.3f\n", c.method.c_str(), c.label.c_str(), micros[micros.size() / 2]);
    }
  }
  std::printf("%s: %zu of %zu cases match their expected outputs\n", failed ? "FAILED" : "PASSED",
              cases.size() - failed, cases.size());
  return failed ? 1 : 0;
}
