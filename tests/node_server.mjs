// Shared by the node client tests: start a real `lamina serve` on a free loopback port, wait for
// /health, and stop it with SIGTERM (its exit code must be 0).
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
export const repo = path.resolve(here, '..');
// The lamina binary and the model the client tests run (LAMINA_BINARY, LAMINA_MODEL override).
export const binary = process.env.LAMINA_BINARY || path.join(repo, 'build/release/lamina');
export const model = process.env.LAMINA_MODEL || path.join(repo, 'models/lamina-counter.gguf');

// An npm package from tests/node (never a global one), or exit 77 (skipped) when it is not
// installed.
export function requireClient(name) {
  try {
    return createRequire(path.join(here, 'node', 'package.json'))(name);
  } catch {
    console.log(`SKIP: ${name} is not installed (npm ci --prefix tests/node)`);
    process.exit(77);
  }
}

export function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
    srv.on('error', reject);
  });
}

// `binary serve --host 127.0.0.1 --port P ...args`; resolves to { proc, base, log(), exited }
// once /health answers 200. `servers` (optional Set) holds it until stopServer.
export async function startServer(binary, args, servers = null) {
  const port = await freePort();
  const proc = spawn(binary, ['serve', '--host', '127.0.0.1', '--port', String(port), ...args],
                     { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  proc.stderr.on('data', (d) => { log += d; });
  const s = { proc, base: `http://127.0.0.1:${port}`, log: () => log, exited: false };
  proc.on('exit', () => { s.exited = true; });
  if (servers) servers.add(s);
  for (let i = 0; i < 300 && !s.exited; ++i) {
    try {
      const r = await fetch(`${s.base}/health`);
      if (r.status === 200) return s;
    } catch { /* not listening yet */ }
    await new Promise((r) => setTimeout(r, 50));
  }
  proc.kill('SIGKILL');
  throw new Error(`the server did not become healthy:\n${log}`);
}

// SIGTERM; asserts exit code 0 within 10 s and returns the milliseconds it took.
export async function stopServer(s, servers = null) {
  assert.ok(!s.exited, `the server exited before SIGTERM\n${s.log()}`);
  const exited = new Promise((resolve) => s.proc.once('exit', (code) => resolve(code)));
  const t0 = Date.now();
  s.proc.kill('SIGTERM');
  const code = await Promise.race([exited, new Promise((r) => setTimeout(() => r('timeout'), 10_000))]);
  if (code === 'timeout') s.proc.kill('SIGKILL');
  assert.equal(code, 0, `the server's exit code after SIGTERM\n${s.log()}`);
  if (servers) servers.delete(s);
  return Date.now() - t0;
}

// A streamed chat completion's reasoning_content and content deltas, each joined; a reasoning
// delta after content has begun fails.
export async function streamedParts(stream) {
  let reasoning = '', content = '';
  for await (const chunk of stream) {
    const delta = chunk.choices[0]?.delta ?? {};
    if (delta.reasoning_content) {
      assert.equal(content, '', 'reasoning after content');
      reasoning += delta.reasoning_content;
    }
    if (delta.content) content += delta.content;
  }
  return { reasoning, content };
}

// The checks of one test script: check(name, fn) runs and reports one; finish(server) exits 1
// with the server's log when any failed.
export function checkRunner() {
  let failures = 0;
  async function check(name, fn) {
    try {
      await fn();
      console.log(`ok   ${name}`);
    } catch (e) {
      ++failures;
      console.log(`FAIL ${name}: ${e.stack || e}`);
    }
  }
  function finish(server) {
    if (failures > 0) {
      console.log(`${failures} check(s) failed; server log:\n${server.log()}`);
      process.exit(1);
    }
    console.log('all checks passed');
  }
  return { check, finish };
}
