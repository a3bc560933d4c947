// Reading whole files for the model-file parsers, with errors that name the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace nibble::llm {

/// The bytes of a file; throws nibble::Error(io_error) "<who>: <path>: cannot ...".
std::vector<uint8_t> read_file_bytes(const std::string& path, const char* who);
/// The contents of a text file.
std::string read_text_file(const std::string& path, const char* who);
bool file_exists(const std::string& path);

}  // namespace nibble::llm
