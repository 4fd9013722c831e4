// The MCP CORS proxy (see cors_proxy.h): cpp-httplib's client runs on a thread of its own and
// hands the answer over through a bounded pipe, which the route's chunked body drains.
#include "cors_proxy.h"

#include <httplib.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace lamina::cli::cors_proxy {

namespace {

constexpr const char* kHeaderPrefix = "x-llama-server-proxy-header-";
// Marks the requests this proxy sends; /cors-proxy refuses a request that carries it, so a chain
// of proxies that leads back to one cannot tie up the workers waiting on each other.
constexpr const char* kViaToken = "lamina-cors-proxy";
constexpr int kConnectTimeoutS = 10;
constexpr int kReadWriteTimeoutS = 600;  // an MCP event stream may be quiet for long
// Most bytes of the answer waiting for the client: the target is read no faster than it takes.
constexpr size_t kPipeBytes = size_t{1} << 20;

std::string Lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

struct TargetUrl {
  std::string origin;  // scheme://host:port, as cpp-httplib's Client takes it
  std::string path;    // path and query, at least "/"
};

bool ParseTargetUrl(const std::string& url, TargetUrl* out, std::string* error) {
  for (unsigned char ch : url) {
    if (ch <= 0x20 || ch == 0x7f) {
      *error = "the target URL holds a space or a control character";
      return false;
    }
  }
  const size_t scheme_end = url.find("://");
  const std::string scheme =
      scheme_end == std::string::npos ? "" : Lower(url.substr(0, scheme_end));
  if (scheme != "http" && scheme != "https") {
    *error = "the target URL must start with http:// or https://";
    return false;
  }
  const size_t authority_start = scheme_end + 3;
  const size_t authority_end = url.find_first_of("/?#", authority_start);
  const std::string authority = url.substr(authority_start, authority_end - authority_start);
  if (authority.find('@') != std::string::npos) {
    *error = "credentials in the target URL are not supported";
    return false;
  }
  std::string host = authority, port;
  if (!authority.empty() && authority.front() == '[') {
    const size_t close = authority.find(']');
    if (close == std::string::npos) {
      *error = "the target URL's IPv6 address lacks its ']'";
      return false;
    }
    host = authority.substr(0, close + 1);
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':') {
        *error = "the target URL's host is malformed";
        return false;
      }
      port = authority.substr(close + 2);
    }
  } else if (const size_t colon = authority.find(':'); colon != std::string::npos) {
    host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
  }
  if (host.empty() || host == "[]") {
    *error = "the target URL has no host";
    return false;
  }
  if (port.empty()) {
    port = scheme == "https" ? "443" : "80";
  } else if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
             std::stoi(port) < 1 || std::stoi(port) > 65535) {
    *error = "the target URL's port must be a number in [1, 65535]";
    return false;
  }
  out->origin = scheme + "://" + host + ":" + port;
  std::string path = authority_end == std::string::npos ? "" : url.substr(authority_end);
  path = path.substr(0, path.find('#'));
  if (path.empty() || path.front() != '/') path = "/" + path;
  out->path = path;
  return true;
}

// Headers of the target's answer that are not passed on: hop-by-hop ones and those the HTTP
// layer writes itself, CORS headers (the server's own CORS rules decide who may read), and
// cookies (they would be set for this server's origin).
bool DropAnswerHeader(const std::string& lower_name) {
  static const char* const kDropped[] = {"server",     "transfer-encoding", "content-length",
                                         "keep-alive", "connection",        "content-type",
                                         "set-cookie", "set-cookie2",       "vary"};
  for (const char* d : kDropped) {
    if (lower_name == d) return true;
  }
  return lower_name.rfind("access-control-", 0) == 0;
}

// The answer on its way from the client thread to the route's body.
struct Pipe {
  std::mutex mutex;
  std::condition_variable changed;
  bool head_ready = false;
  int status = 0;
  std::string content_type;
  std::vector<std::pair<std::string, std::string>> headers;
  std::deque<std::string> chunks;
  size_t bytes = 0;
  bool finished = false;  // the target's answer is complete, or failed
  bool closed = false;    // the client of this server went away: stop reading the target
  std::string error;      // why the target gave no answer

  void TakeHead(const httplib::Response& answer) {
    status = answer.status;
    for (const auto& [name, value] : answer.headers) {
      const std::string lower = Lower(name);
      if (lower == "content-type") content_type = value;
      if (!DropAnswerHeader(lower)) headers.emplace_back(name, value);
    }
    head_ready = true;
  }
};

void RunClient(std::shared_ptr<Pipe> pipe, TargetUrl target, std::string method,
               httplib::Headers headers, std::string body) {
  httplib::Client client(target.origin);
  client.set_follow_location(true);
  client.set_connection_timeout(kConnectTimeoutS, 0);
  client.set_read_timeout(kReadWriteTimeoutS, 0);
  client.set_write_timeout(kReadWriteTimeoutS, 0);
  client.set_decompress(false);  // bytes and Content-Encoding pass on as they came
  httplib::Request request;
  request.method = std::move(method);
  request.path = target.path;
  request.headers = std::move(headers);
  request.body = std::move(body);
  request.response_handler = [pipe](const httplib::Response& answer) {
    std::lock_guard<std::mutex> lock(pipe->mutex);
    pipe->TakeHead(answer);
    pipe->changed.notify_all();
    return !pipe->closed;
  };
  request.content_receiver = [pipe](const char* data, size_t size, uint64_t, uint64_t) {
    std::unique_lock<std::mutex> lock(pipe->mutex);
    pipe->changed.wait(lock, [&] { return pipe->closed || pipe->bytes < kPipeBytes; });
    if (pipe->closed) return false;
    pipe->chunks.emplace_back(data, size);
    pipe->bytes += size;
    pipe->changed.notify_all();
    return true;
  };
  httplib::Response answer;
  httplib::Error error = httplib::Error::Success;
  const bool ok = client.send(request, answer, error);
  std::lock_guard<std::mutex> lock(pipe->mutex);
  // A 204 or a HEAD answer has no body, and cpp-httplib then skips the response handler.
  if (ok && !pipe->head_ready) pipe->TakeHead(answer);
  if (!pipe->head_ready) pipe->error = httplib::to_string(error);
  pipe->finished = true;
  pipe->changed.notify_all();
}

}  // namespace

bool Forward(const http::Request& req, http::Response& res, Failure* failure) {
  if (Lower(req.get_header_value("Via")).find(kViaToken) != std::string::npos) {
    *failure = {508, "invalid_request_error",
                "the request came through this kind of proxy already: a proxy loop"};
    return false;
  }
  const std::string url = req.get_param_value("url");
  if (url.empty()) {
    *failure = {400, "invalid_request_error", "the \"url\" query parameter is missing"};
    return false;
  }
  TargetUrl target;
  std::string error;
  if (!ParseTargetUrl(url, &target, &error)) {
    *failure = {400, "invalid_request_error", error};
    return false;
  }
  httplib::Headers headers;
  const size_t prefix_size = std::char_traits<char>::length(kHeaderPrefix);
  for (const auto& [name, value] : req.headers) {
    const std::string lower = Lower(name);
    if (lower.rfind(kHeaderPrefix, 0) != 0 || lower.size() == prefix_size) continue;
    const std::string forwarded = lower.substr(prefix_size);
    // Framing and routing are this request's own; a compressed answer is not asked for.
    if (forwarded == "host" || forwarded == "content-length" || forwarded == "transfer-encoding" ||
        forwarded == "connection" || forwarded == "accept-encoding" || forwarded == "via") {
      continue;
    }
    headers.emplace(forwarded, value);
  }
  headers.emplace("Via", std::string("1.1 ") + kViaToken);
  auto pipe = std::make_shared<Pipe>();
  std::thread(RunClient, pipe, target, req.method, std::move(headers), req.body).detach();
  {
    std::unique_lock<std::mutex> lock(pipe->mutex);
    pipe->changed.wait(lock, [&] { return pipe->head_ready || pipe->finished; });
    if (!pipe->head_ready) {
      *failure = {502, "server_error", "the target URL did not answer: " + pipe->error};
      return false;
    }
    res.status = pipe->status;
    for (auto& header : pipe->headers) res.headers.push_back(std::move(header));
  }
  const std::string content_type =
      pipe->content_type.empty() ? "application/octet-stream" : pipe->content_type;
  if (res.status == 204 || res.status == 304 || req.method == "HEAD") {
    std::lock_guard<std::mutex> lock(pipe->mutex);
    pipe->closed = true;
    pipe->changed.notify_all();
    if (res.status != 204 && res.status != 304) res.set_content("", content_type);
    return true;
  }
  res.set_chunked_content_provider(
      content_type,
      [pipe](size_t, http::DataSink& sink) {
        std::unique_lock<std::mutex> lock(pipe->mutex);
        pipe->changed.wait_for(lock, std::chrono::milliseconds(100),
                               [&] { return !pipe->chunks.empty() || pipe->finished; });
        if (pipe->chunks.empty()) {
          if (pipe->finished) sink.done();
          return true;
        }
        const std::string chunk = std::move(pipe->chunks.front());
        pipe->chunks.pop_front();
        pipe->bytes -= chunk.size();
        pipe->changed.notify_all();
        lock.unlock();
        return sink.write(chunk.data(), chunk.size());
      },
      [pipe](bool) {
        std::lock_guard<std::mutex> lock(pipe->mutex);
        pipe->closed = true;
        pipe->changed.notify_all();
      });
  return true;
}

}  // namespace lamina::cli::cors_proxy
