/**
 * The `{ http: "METHOD /path" }` trigger kind: a route of the set's one HTTP server (Hono on
 * Node, ../http-server.ts, loaded when the kind binds: a command line call never loads it), beside
 * the runtime's own `/healthz`, `/readyz` and `/metrics`. It always listens, also when no
 * function has a route; with a token, every path but `/healthz` and `/readyz` asks for it; it
 * refuses to start on a host that is not loopback without one (docs/runtime.md §6.3.4).
 */
import { BlockList, isIP } from "node:net";
import { z } from "zod";
import type { HttpInfo } from "../http-server.ts";
import type { TriggerKind } from "./kind.ts";

/** HTTP methods a function can be bound to. */
export const HTTP_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"] as const;
export type HttpMethod = (typeof HTTP_METHODS)[number];

/** `{ http: "METHOD /path" }`. */
export type HttpTrigger = { readonly http: `${HttpMethod} /${string}` };
export type { HttpInfo };

/** HTTP paths the runtime answers itself: health, readiness and metrics. */
export const RUNTIME_PATHS = ["/healthz", "/readyz", "/metrics"];

const schema = z.strictObject({
  http: z
    .string()
    .regex(new RegExp(`^(${HTTP_METHODS.join("|")}) /\\S*$`), `must be "METHOD /path" with METHOD one of ${HTTP_METHODS.join(", ")}`),
}) as unknown as z.ZodType<HttpTrigger>;

const loopback = new BlockList();
loopback.addSubnet("127.0.0.0", 8, "ipv4");
loopback.addAddress("::1", "ipv6");

/** Whether `host` is a loopback address: in 127.0.0.0/8, `::1` (IPv4-mapped ones too), or `localhost`. */
export function isLoopback(host: string): boolean {
  if (host.toLowerCase() === "localhost") return true;
  const family = isIP(host);
  return family !== 0 && loopback.check(host, family === 4 ? "ipv4" : "ipv6");
}

export const http: TriggerKind<"http", HttpTrigger, HttpInfo> = {
  key: "http",
  shape: '{ http: "METHOD /path" }',
  schema,
  checkConfig(trigger) {
    const path = trigger.http.split(" ")[1]!;
    return RUNTIME_PATHS.includes(path) ? [{ at: "http", message: `${path} is the runtime's own (${RUNTIME_PATHS.join(", ")})` }] : [];
  },
  /** A host that is not loopback needs a token, or the network said trusted. */
  checkStart(config) {
    const { host, token, trustedNetwork } = config.http;
    if (isLoopback(host) || token !== undefined || trustedNetwork === true) return [];
    return [
      `HTTP_HOST ${host} is not a loopback address and no HTTP_TOKEN is set: anyone who reaches it could ask every route. ` +
        "Set HTTP_TOKEN (http.token) to a token of at least 16 characters, or HTTP_TRUSTED_NETWORK=1 (http.trustedNetwork: true) " +
        "if only trusted machines reach that network",
    ];
  },
  exclusive: (trigger) => `route ${trigger.http}`,
  describe: (trigger) => `http ${trigger.http}`,

  /** Listens on the config's `http.host` and `http.port` (0: a free one), guarded by `http.token`; throws saying a port in use. */
  async bind(targets, env) {
    const { host, port, token } = env.config.http;
    if (token === undefined && !isLoopback(host)) {
      env.log.warn({ host }, "HTTP is open to the network without a token: HTTP_TRUSTED_NETWORK says it is trusted");
    }
    const { closeHttp, httpApp, listen } = await import("../http-server.ts");
    const server = await listen(httpApp(targets, env, token), host, port);
    const bound = (server.address() as { port: number }).port;
    return { url: `http://${host}:${bound}`, stop: () => closeHttp(server, env.graceMs) };
  },
};
