// Small helpers shared by the core's units: shapes and dtypes as the manifest spells them.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "check.h"

namespace flyship {

inline std::string shape_str(c10::IntArrayRef s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << "]";
  return o.str();
}

inline std::string join(const std::vector<std::string>& parts, const char* sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

inline at::ScalarType dtype_from_name(const std::string& name) {
  static const std::map<std::string, at::ScalarType> table = {
      {"float64", at::kDouble}, {"float32", at::kFloat}, {"float16", at::kHalf}, {"bfloat16", at::kBFloat16},
      {"float8_e4m3fn", at::kFloat8_e4m3fn}, {"float8_e5m2", at::kFloat8_e5m2},
      {"float8_e4m3fnuz", at::kFloat8_e4m3fnuz}, {"float8_e5m2fnuz", at::kFloat8_e5m2fnuz},
      {"int64", at::kLong}, {"int32", at::kInt}, {"int16", at::kShort}, {"int8", at::kChar}, {"uint8", at::kByte},
      {"bool", at::kBool}};
  auto it = table.find(name);
  FLYSHIP_CHECK(it != table.end(), "flyship plan: unknown dtype '", name, "'");
  return it->second;
}

// torch's dtype names as the manifest writes them ("float32", not "Float").
inline std::string dtype_name(at::ScalarType t) {
  std::string s = c10::toString(t);
  static const std::map<std::string, std::string> table = {
      {"Double", "float64"}, {"Float", "float32"}, {"Half", "float16"}, {"BFloat16", "bfloat16"}, {"Long", "int64"},
      {"Int", "int32"}, {"Short", "int16"}, {"Char", "int8"}, {"Byte", "uint8"}, {"Bool", "bool"},
      {"Float8_e4m3fn", "float8_e4m3fn"}, {"Float8_e5m2", "float8_e5m2"}, {"Float8_e4m3fnuz", "float8_e4m3fnuz"},
      {"Float8_e5m2fnuz", "float8_e5m2fnuz"}};
  auto it = table.find(s);
  return it == table.end() ? s : it->second;
}

}  // namespace flyship
