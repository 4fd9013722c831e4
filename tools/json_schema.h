// JSON Schema → GBNF, for `json_schema`, `response_format` and `--json-schema`: the grammar
// accepts exactly the JSON texts (compact or with bounded whitespace) that the schema allows,
// for the subset listed in docs/SERVER.md ("Structured output"). Errors name the schema path.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "util/status.h"

namespace lamina::cli {

// The GBNF source (start rule `root`) for `schema` (ordered: object members keep the schema's
// order); a schema using an unsupported keyword in a way that changes what is valid is an error
// naming its JSON pointer.
Result<std::string> JsonSchemaToGbnf(const nlohmann::ordered_json& schema);

}  // namespace lamina::cli
