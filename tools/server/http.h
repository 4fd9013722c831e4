// The server's HTTP/1.1 layer over Boost.Beast: one event-driven thread reads every request head
// and body under hard limits and deadlines (a slow or idle client costs a socket and a bounded
// buffer, never a thread), and a fixed pool of workers runs the handlers of complete requests.
// The types mirror the small part of cpp-httplib's server API the routes use.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace lamina::cli::http {

// What one request may cost before a handler runs; each refusal is a 4xx whose message names the
// limit (docs/SERVER.md, "Limits").
struct Limits {
  size_t max_body_bytes = 8u << 20;       // after transfer decoding (chunked); 413 above
  size_t max_bodyless_bytes = 16u << 10;  // body of a GET/HEAD/OPTIONS/DELETE request; 413 above
  size_t max_head_bytes = 16u << 10;      // request line and every header together; 431 above
  size_t max_header_count = 100;          // header fields; 431 above
  int head_timeout_ms = 10000;            // the whole head, from the first byte awaited; closed
  int body_timeout_ms = 60000;            // the whole body, once the head is read; closed
  int write_timeout_ms = 30000;           // a client that takes no bytes for this long is dropped
  // Open connections. At the cap, a new client takes the place of the connection that has
  // waited longest for a head (idle keep-alive or slow); only when every connection has a
  // request in the workers is the new one refused (503).
  size_t max_connections = 1024;
  // Bytes of request bodies being received or handled at once (a body counts its Content-Length,
  // or the body cap when chunked, from its head until its handler returns); a request that would
  // pass it is refused (503) from its head, so many large uploads cannot add up.
  size_t max_body_bytes_in_flight = size_t{256} << 20;
  size_t n_workers = 64;  // handler threads: requests handled at once (more wait in a queue)
};

struct Request {
  std::string method;  // "GET", "POST", ...; HEAD runs the GET handler without the body
  std::string target;  // as sent: path and query
  std::string path;    // percent-decoded, without the query
  std::string body;
  std::string remote_addr;
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
  std::vector<std::pair<std::string, std::string>> params;   // the query, decoded
  std::vector<std::string> matches;  // the route pattern's match and its groups

  // The first header of that name (any case), or "".
  std::string get_header_value(const std::string& name) const;
  bool has_header(const std::string& name) const;
  std::string get_param_value(const std::string& name) const;
};

// A streamed body: every write is one chunk; false when the client has gone (or takes no bytes
// for the write timeout), and the provider should then stop.
class DataSink {
 public:
  virtual ~DataSink() = default;
  virtual bool write(const char* data, size_t size) = 0;
  virtual void done() = 0;
};

// Called until it calls sink.done() or returns false; it should wait (not spin) when it has
// nothing to write. The releaser runs once at the end: true when done() was reached.
using ContentProvider = std::function<bool(size_t offset, DataSink& sink)>;
using ContentReleaser = std::function<void(bool success)>;

struct Response {
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  ContentProvider provider;  // set: the body is streamed (chunked transfer encoding)
  ContentReleaser releaser;

  void set_header(const std::string& name, const std::string& value);
  std::string get_header_value(const std::string& name) const;
  void erase_header(const std::string& name);
  void set_content(std::string content, const std::string& content_type);
  void set_chunked_content_provider(const std::string& content_type, ContentProvider p,
                                    ContentReleaser r = nullptr);
};

using Handler = std::function<void(const Request&, Response&)>;
// Runs on a complete head, before the body is read: returns true when it answered (an
// unauthorized request, say), so that body is never read.
using HeadFilter = std::function<bool(const Request& head, Response& res)>;
// Fills the body of an answer the HTTP layer gives itself (404, 413, 431, ...).
using ErrorWriter = std::function<void(Response& res, int status, const std::string& message)>;
// Adds headers to every answer (handlers' and the layer's own) just before it is written.
using Decorator = std::function<void(const Request& req, Response& res)>;
// Told of every answer once it is written (or failed): the request (its head only when the layer
// refused it), the answer, and the milliseconds since the head was complete.
using AccessLog = std::function<void(const Request& req, const Response& res, double ms)>;

class Server {
 public:
  explicit Server(Limits limits);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Routes: the pattern is "*" (any path), a literal path, or a literal with one "{int}" (an
  // integer, Request::matches[1]); matched against the whole decoded path.
  void Get(const std::string& pattern, Handler h);
  void Post(const std::string& pattern, Handler h);
  void Options(const std::string& pattern, Handler h);
  void SetHeadFilter(HeadFilter f);
  void SetErrorWriter(ErrorWriter w);
  void SetDecorator(Decorator d);
  void SetAccessLog(AccessLog log);
  void SetDefaultHeaders(std::vector<std::pair<std::string, std::string>> headers);

  // Binds and listens; false with the reason in *error.
  bool Bind(const std::string& host, int port, std::string* error);
  // Serves until Stop(); call from one thread.
  void Run();
  // Stops accepting, drops idle connections, ends streams (their writes fail) and waits for the
  // workers; safe from any thread, also before Run() started.
  void Stop();
  bool running() const;

  struct Stats {
    size_t open_connections = 0;
    size_t busy_connections = 0;
    size_t queued_requests = 0;
  };
  Stats stats() const;

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace lamina::cli::http
