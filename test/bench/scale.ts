/**
 * The per-key figures docs/scale.md §11 scales from: one bucket of `SCALE_KEYS` keys (default
 * 300,000) shaped as needs keys, with values of about 110 bytes, on a real nats-server; the
 * time of a live view's load and the heap and RSS it adds; a direct get of one key, and a
 * filtered watch of 10 keys, each p50 of `SCALE_ASKS` (200). Prints the figures, judges none.
 */
import { pino } from "pino";
import { readBucket } from "../../runtime/buckets.ts";
import { openView } from "../../runtime/views/index.ts";
import { testBus, until } from "../helpers.ts";

const KEYS = Number(process.env.SCALE_KEYS ?? 300_000);
const ASKS = Number(process.env.SCALE_ASKS ?? 200);
const BUCKET = "mesh-provisioner_scale-probe";
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const mb = (n: number) => `${(n / 1e6).toFixed(1)} MB`;
const gc = () => (globalThis as { gc?: () => void }).gc?.();
const memory = () => {
  gc();
  return process.memoryUsage();
};

const bus = await testBus({ seatPermissions: { publish: { allow: [">"] }, subscribe: { allow: [">"] } } });
try {
  const nc = await bus.connect();
  const kv = await nc.jetstream().views.kv(BUCKET, { history: 1, allow_direct: true });
  const encoder = new TextEncoder();
  const began = performance.now();
  for (let i = 0; i < KEYS; i++) {
    const [n, m, j] = [Math.floor(i / 100), Math.floor(i / 10) % 10, i % 10];
    const value = JSON.stringify({ value: `postgres://db-${n}.mesh:5432/m${m}_${j}`, by: `n${n}`, note: "x".repeat(40) });
    nc.publish(`$KV.${BUCKET}.n${n}.m${m}.config.v${j}`, encoder.encode(value));
    if (i % 10_000 === 9_999) await nc.flush();
  }
  const jsm = await nc.jetstreamManager();
  await until(async () => (await jsm.streams.info(`KV_${BUCKET}`)).state.messages === KEYS, 120_000, "every key stored");
  console.log(`filled ${KEYS.toLocaleString("en-US")} keys in ${((performance.now() - began) / 1000).toFixed(1)} s`);

  const before = memory();
  const t = performance.now();
  const view = await openView(nc, BUCKET, readBucket(kv, BUCKET), pino({ level: "silent" }));
  await view.loaded;
  const loadMs = performance.now() - t;
  const after = memory();
  console.log(`view load: ${loadMs.toFixed(0)} ms, ${((loadMs * 1000) / KEYS).toFixed(2)} µs a key`);
  console.log(
    `view holds: heap +${mb(after.heapUsed - before.heapUsed)}, RSS +${mb(after.rss - before.rss)}, ` +
      `${((after.rss - before.rss) / KEYS).toFixed(0)} bytes a key (RSS), ${((after.heapUsed - before.heapUsed) / KEYS).toFixed(0)} (heap)`,
  );

  const gets: number[] = [];
  const watches: number[] = [];
  for (let i = 0; i < ASKS; i++) {
    const key = `n${(i * 7) % (KEYS / 100)}.m3.config.v${i % 10}`;
    let s = performance.now();
    await kv.get(key, { direct: true } as never);
    gets.push(performance.now() - s);
    s = performance.now();
    let done = false;
    const watch = await kv.watch({ key: `n${(i * 7) % (KEYS / 100)}.m3.>`, initializedFn: () => (done = true) });
    if (done) watch.stop();
    for await (const entry of watch) if (entry.delta === 0) watch.stop();
    watches.push(performance.now() - s);
  }
  console.log(`direct get of one key p50: ${median(gets).toFixed(3)} ms; filtered watch of 10 keys p50: ${median(watches).toFixed(3)} ms`);
  view.stop();
  await nc.close();
} finally {
  await bus.stop();
}
