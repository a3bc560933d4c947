// Small helpers shared by the nibble CLI's subcommands.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace nibble::cli {

/// "--name value" and "--flag" arguments after the subcommand.
struct Args {
  std::map<std::string, std::string> options;
  bool has(const std::string& name) const { return options.count(name) != 0; }
  std::string get(const std::string& name, const std::string& fallback) const;
  long long get_int(const std::string& name, long long fallback) const;
};

/// Parses argv[first..]; throws nibble::Error(invalid_argument) for a stray positional word or
/// an option that is not in `known`.
Args parse_args(int argc, char** argv, int first, const std::vector<std::string>& known);

std::vector<std::string> split_list(const std::string& s);

int run_demo(const Args& args);

// The LLM runner (llm_commands.cpp): argv[2] is the model path.
int run_model_info(int argc, char** argv);
int run_generate(int argc, char** argv);
int run_perplexity(int argc, char** argv);
int run_tokenize(int argc, char** argv);
int run_quantize_model(int argc, char** argv);
int run_quantize(int argc, char** argv);
int run_bench_model(int argc, char** argv);
int run_granularity(int argc, char** argv);

}  // namespace nibble::cli
