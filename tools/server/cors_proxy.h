// llama-server's MCP CORS proxy (`--ui-mcp-proxy`, off by default): GET/POST /cors-proxy?url=U
// sends the request on to U and streams the answer back, so a web page can reach a server that
// does not allow its origin. Only the headers a client names as
// `x-llama-server-proxy-header-NAME` go on (as NAME): never its API key, cookies or proxy
// credentials.
#pragma once

#include <string>

#include "http.h"

namespace lamina::cli::cors_proxy {

// Why a request was not forwarded: the status, type and message of the error answer.
struct Failure {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string message;
};

// Forwards req (its method and body) to the http or https URL of its "url" query parameter.
// True: res holds the target's status and headers (without hop-by-hop, CORS and cookie ones)
// and streams its body. False: *failure says why (a bad URL, a loop through this proxy, a
// target that did not answer).
bool Forward(const http::Request& req, http::Response& res, Failure* failure);

}  // namespace lamina::cli::cors_proxy
