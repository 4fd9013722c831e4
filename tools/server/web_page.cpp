// The web chat and monitor page served at "/" (one self-contained page: no build step, no CDN).
#include "server.h"

namespace lamina::cli {

const std::string& WebPage() {
  static const std::string kPage = R"HTML(<!doctype html><title>lamina</title><p>lamina</p>)HTML";
  return kPage;
}

}  // namespace lamina::cli
