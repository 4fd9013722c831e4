// The web page's files by URL path, with their Content-Type (the bytes: web_files.h).
#include "web_files.h"

#include <map>

namespace lamina::cli {
namespace {

const char* ContentTypeOf(std::string_view name) {
  auto ends_with = [&](std::string_view ext) { return name.ends_with(ext); };
  if (ends_with(".html")) return "text/html; charset=utf-8";
  if (ends_with(".js")) return "text/javascript; charset=utf-8";
  if (ends_with(".css")) return "text/css; charset=utf-8";
  if (ends_with(".json")) return "application/json; charset=utf-8";
  if (ends_with(".svg")) return "image/svg+xml";
  return "application/octet-stream";
}

const std::map<std::string, WebFile, std::less<>>& FilesByPath() {
  static const auto* const kFiles = [] {
    auto* files = new std::map<std::string, WebFile, std::less<>>;
    for (const EmbeddedFile& f : EmbeddedWebFiles()) {
      const WebFile file{f.bytes, ContentTypeOf(f.name)};
      (*files)["/" + std::string(f.name)] = file;
      if (f.name == "index.html") (*files)["/"] = file;
    }
    return files;
  }();
  return *kFiles;
}

}  // namespace

const WebFile* FindWebFile(std::string_view url_path) {
  const auto& files = FilesByPath();
  const auto it = files.find(url_path);
  return it == files.end() ? nullptr : &it->second;
}

const std::vector<std::string>& WebFilePaths() {
  static const auto* const kPaths = [] {
    auto* paths = new std::vector<std::string>;
    for (const auto& [path, file] : FilesByPath()) paths->push_back(path);
    return paths;
  }();
  return *kPaths;
}

}  // namespace lamina::cli
