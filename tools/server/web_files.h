// The web chat and monitor page's files (tools/server/web/, and marked.min.js when the build found
// it), embedded into the binary at build time by tools/server/embed_files.cmake.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace lamina::cli {

// One embedded file: its name without the folder ("index.html", "app.js") and its bytes.
struct EmbeddedFile {
  std::string_view name;
  std::string_view bytes;
};

// Every embedded file (defined in the generated web_files.cpp of the build folder).
std::span<const EmbeddedFile> EmbeddedWebFiles();

// A file of the web page as served: its bytes and Content-Type.
struct WebFile {
  std::string_view bytes;
  const char* content_type;
};

// The file served at a URL path: "/" and "/index.html" are the page, "/NAME" the file NAME;
// null when there is none.
const WebFile* FindWebFile(std::string_view url_path);

// The URL paths FindWebFile answers ("/", "/index.html", "/app.js", ...).
const std::vector<std::string>& WebFilePaths();

}  // namespace lamina::cli
