// Aggregate decode throughput of a running server (`lamina serve` or llama-server) with 1, 2,
// 4, 8 concurrent streams: each stream asks /completion for N tokens (ignore_eos, greedy, no
// prompt reuse); aggregate tok/s = all predicted tokens / wall time of the round, per-stream
// tok/s = the server's own predicted_per_second. Median over rounds. Prints a table.
//   node bench/serve_bench.mjs URL [--streams 1,2,4,8] [--tokens 128] [--rounds 3]
const args = process.argv.slice(2);
const url = args.find((a) => !a.startsWith('--')) ?? 'http://127.0.0.1:8080';
const opt = (name, dflt) => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? args[i + 1] : dflt;
};
const streams = opt('streams', '1,2,4,8').split(',').map(Number);
const tokens = Number(opt('tokens', '128'));
const rounds = Number(opt('rounds', '3'));
const median = (v) => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)];

async function one(i) {
  const r = await fetch(`${url}/completion`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({
      prompt: `Story ${i}: Once upon a time there was a`, n_predict: tokens, ignore_eos: true,
      temperature: 0, cache_prompt: false,
    }),
  });
  const j = await r.json();
  return { n: j.tokens_predicted, tps: j.timings?.predicted_per_second ?? 0 };
}

console.log(`server ${url} | ${tokens} tokens per stream | median of ${rounds} rounds`);
console.log('streams  aggregate tok/s  per-stream tok/s  vs 1');
let single = 0;
for (const n of streams) {
  const agg = [], per = [];
  for (let r = 0; r < rounds; ++r) {
    const t0 = performance.now();
    const results = await Promise.all(Array.from({ length: n }, (_, i) => one(i)));
    const seconds = (performance.now() - t0) / 1e3;
    agg.push(results.reduce((s, x) => s + x.n, 0) / seconds);
    per.push(median(results.map((x) => x.tps)));
  }
  const a = median(agg);
  if (n === 1) single = a;
  console.log(`${String(n).padStart(7)}  ${a.toFixed(1).padStart(15)}  ${median(per).toFixed(1).padStart(16)}  ${single ? (a / single).toFixed(2) : '-'}x`);
}
