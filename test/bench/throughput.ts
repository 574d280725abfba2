/**
 * `npm run bench:throughput`: many requesters at once (docs/scale.md §11.7). On the bench's
 * embedded nats-server with 100,000 needs, for 32, 128 and 512 requesters, each asking one
 * request after another for 3 s, on one connection each and all on one connection: requests a
 * second of echo served by another process, of echo served in the requesters' own process, and
 * of the narrowed verb; the verb's against each echo; requests that failed; and the set's CPU
 * (user and system) per answer. Figures, not tests: nothing fails on a figure.
 */
import { readFileSync } from "node:fs";
import { connect, type NatsConnection } from "nats";
import { askVerb, count, fill, line, needsOf, openBench } from "./harness.ts";

const NODES = 1000;
const SECONDS = 3;
const SIZES = [32, 128, 512];
const encoder = new TextEncoder();
const body = encoder.encode('{"what":"needs","node":"n5","module":"m3"}');

/** The CPU time of `pid` so far (user and system), in seconds. */
const cpuOf = (pid: number) => {
  const fields = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" ");
  return (Number(fields[11]) + Number(fields[12])) / 100;
};

/** Requests a second of `requesters` loops over `connections` (round robin) for {@link SECONDS}, and how many failed. */
async function rate(connections: readonly NatsConnection[], requesters: number, ask: (nc: NatsConnection) => Promise<unknown>) {
  let done = 0;
  let failed = 0;
  const began = performance.now();
  const until = began + SECONDS * 1000;
  await Promise.all(
    Array.from({ length: requesters }, async (_, i) => {
      const nc = connections[i % connections.length]!;
      while (performance.now() < until) {
        try {
          await ask(nc);
          done++;
        } catch {
          failed++;
        }
      }
    }),
  );
  return { rps: done / ((performance.now() - began) / 1000), done, failed };
}

const bench = await openBench();
try {
  const { nc, server, benchUser } = bench;
  line(`throughput bench: node ${process.version}, nats-server ${bench.natsVersion}`);
  const set = await bench.startSet();
  await fill(await bench.kv("needs"), needsOf(0, NODES));
  line(`filled needs: ${count(NODES * 100)} keys`);
  await bench.startEcho();
  // The echo in this process, on a connection of its own.
  const local = await connect({ servers: server.url, ...benchUser, name: "bench local echo" });
  local.subscribe("bench.echo.local", { callback: (_err, msg) => msg.respond(msg.data) });
  await local.flush();
  const pool: NatsConnection[] = [];
  for (let i = 0; i < Math.max(...SIZES); i++)
    pool.push(await connect({ servers: server.url, ...benchUser, name: `bench requester ${i}` }));
  const pid = set.process.pid!;
  const verb = (c: NatsConnection) => askVerb(c, { what: "needs", node: "n5", module: "m3" });
  await rate([nc], 8, verb); // warm

  line(
    "requesters · connections · echo (other process) · echo (this process) · verb req/s · verb/echo · verb/local echo · failed · set CPU a verb answer",
  );
  for (const requesters of SIZES) {
    for (const shared of [false, true]) {
      const connections = shared ? [nc] : pool.slice(0, requesters);
      const echo = await rate(connections, requesters, (c) => c.request("bench.echo", body, { timeout: 10_000 }));
      const localEcho = await rate(connections, requesters, (c) => c.request("bench.echo.local", body, { timeout: 10_000 }));
      const cpu0 = cpuOf(pid);
      const asked = await rate(connections, requesters, verb);
      const cpuPerAnswer = ((cpuOf(pid) - cpu0) / Math.max(1, asked.done)) * 1e6;
      line(
        `${requesters} · ${shared ? "one" : "one each"} · ${count(Math.round(echo.rps))} · ${count(Math.round(localEcho.rps))} · ${count(Math.round(asked.rps))} · ` +
          `${(asked.rps / echo.rps).toFixed(2)} · ${(asked.rps / localEcho.rps).toFixed(2)} · ${echo.failed + localEcho.failed + asked.failed} · ${cpuPerAnswer.toFixed(0)} µs`,
      );
    }
  }
  await Promise.all([...pool, local].map((c) => c.close()));
} finally {
  await bench.stop();
}
