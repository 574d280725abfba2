/**
 * The set's HTTP server for the `http` trigger kind (triggers/http.ts): one Hono app on Node with a route
 * per trigger, the token's guard, and listening and closing (docs/runtime.md §6.3.4).
 */
import type { Server } from "node:http";
import { serve, type ServerType } from "@hono/node-server";
import { Hono, type Context as HonoContext, type MiddlewareHandler } from "hono";
import { bearerAuth } from "hono/bearer-auth";
import { html } from "hono/html";
import { HTTPException } from "hono/http-exception";
import { errorBody } from "./errors.ts";
import { HtmlText, jsonOf } from "./json.ts";
import type { Logger } from "pino";
import type { Outcome, RawInput } from "./types.ts";

/** The paths open without the token: an orchestrator's probes carry none (docs/runtime.md §6.3.5). */
export const OPEN_PATHS = ["/healthz", "/readyz"];

/** What the server is given of the trigger kind's bind (triggers/kind.ts `BindEnv`). */
interface HttpEnv<F> {
  run(fn: F, input: RawInput, trigger: HttpInfo): Promise<Outcome>;
  readonly log: Logger;
  readonly probes: { live(): readonly string[]; ready(): readonly string[] };
  metrics(): Promise<{ readonly text: string; readonly contentType: string }>;
}

/** What this server routes: `{ http: "METHOD /path" }` triggers (triggers/http.ts). */
type HttpTrigger = { readonly http: string };
/** What a request's run says of it: the method and the route's path. */
export type HttpInfo = { readonly kind: "http"; readonly method: string; readonly path: string };

/** Reads an HTTP request's input: the query of a GET or DELETE, the JSON body otherwise. */
async function httpInput(c: HonoContext): Promise<RawInput> {
  if (c.req.method === "GET" || c.req.method === "DELETE") {
    const queries = c.req.queries();
    return { value: Object.fromEntries(Object.entries(queries).map(([k, v]) => [k, v.length === 1 ? v[0] : v])) };
  }
  return { data: new Uint8Array(await c.req.arrayBuffer()) };
}

/**
 * Why the query of `url` cannot be read, or nothing: a name or value whose percent-encoding is
 * not UTF-8 (`%FF`, a lone surrogate `%ED%A0%80`, a `%` not followed by two hex digits). Hono
 * hands such text on undecoded, where it would be read as the literal characters.
 */
function malformedQuery(url: string): string | undefined {
  const start = url.indexOf("?");
  if (start < 0) return undefined;
  for (const part of url.slice(start + 1).split("&")) {
    try {
      decodeURIComponent(part.replaceAll("+", " "));
    } catch {
      const name = part.split("=")[0]!;
      return `the query parameter ${/^[\w.-]{1,64}$/.test(name) ? name : "given"} is not percent-encoded UTF-8: ${JSON.stringify(part.slice(0, 100))}`;
    }
  }
  return undefined;
}

/** A refusal as a page of its own, for a browser: the status and the message, escaped. */
const refusedPage = (code: number, message: string) =>
  html`<!doctype html>
    <html lang="en">
      <meta charset="utf-8" />
      <title>${code}: this request cannot be read</title>
      <h1>This request cannot be read</h1>
      <p>${message}</p>
      <p><a href="/">Start again from /</a></p>
    </html>`;

/** A fresh header object per answer: Hono keeps and changes the one it is given. */
const jsonType = () => ({ "content-type": "application/json" });
const htmlType = () => ({ "content-type": "text/html; charset=utf-8" });

const refusal = (code: number, message: string) => new Response(errorBody(code, message), { status: code, headers: jsonType() });

/**
 * Hono's `bearerAuth` on every path but {@link OPEN_PATHS}: no `Authorization` header or another
 * token is a 401, a header that is not `Bearer <token>` a 400, each with the body of
 * docs/verb.md §4. The token is compared in constant time and never said.
 */
function tokenGuard(token: string): MiddlewareHandler {
  const guard = bearerAuth({
    token,
    noAuthenticationHeader: {
      message: () => refusal(401, "this route asks for the bearer token HTTP_TOKEN sets: send Authorization: Bearer <token>"),
    },
    invalidAuthenticationHeader: { message: () => refusal(400, 'the Authorization header is not "Bearer <token>"') },
    invalidToken: { message: () => refusal(401, "the bearer token is not the one HTTP_TOKEN sets") },
  });
  return (c, next) => (OPEN_PATHS.includes(c.req.path) ? next() : guard(c, next));
}

/**
 * One Hono app with a route per trigger. Answers are JSON (an `HtmlText` one HTML), with the status the run asked for
 * (200 unless the handler gave `WithStatus`); a refusal has the status of its code and the body
 * of docs/verb.md §4; an unknown route is a JSON 404. With `token`, every path but
 * {@link OPEN_PATHS} asks for it first ({@link tokenGuard}). Besides, `GET /healthz`
 * answers 200 `{ ok: true }`, or 503 `{ ok: false, reasons }` with what `probes.live` says;
 * `GET /readyz` 200 `{ ready: true }`, or 503 `{ ready: false, reasons }` with what
 * `probes.ready` says is missing; and `GET /metrics` the metrics in Prometheus's text format.
 */
export function httpApp<F>(targets: readonly { readonly fn: F; readonly trigger: HttpTrigger }[], env: HttpEnv<F>, token?: string): Hono {
  const app = new Hono();
  if (token !== undefined) app.use(tokenGuard(token));
  app.get("/healthz", (c) => {
    const dead = env.probes.live();
    return dead.length === 0 ? c.json({ ok: true }) : c.json({ ok: false, reasons: dead }, 503);
  });
  app.get("/metrics", async (c) => {
    const { text, contentType } = await env.metrics();
    return c.body(text, 200, { "content-type": contentType });
  });
  app.get("/readyz", (c) => {
    const notReady = env.probes.ready();
    return notReady.length === 0 ? c.json({ ready: true }) : c.json({ ready: false, reasons: notReady }, 503);
  });
  for (const { fn, trigger } of targets) {
    const [method, path] = trigger.http.split(" ") as [string, string];
    app.on(method, path, async (c) => {
      const malformed = malformedQuery(c.req.url);
      if (malformed !== undefined) {
        // Refused before any function runs: a browser asking for a page is answered a page.
        if (/\btext\/html\b/.test(c.req.header("accept") ?? "")) return c.html(refusedPage(400, malformed), 400);
        return c.body(errorBody(400, malformed), 400, jsonType());
      }
      const outcome = await env.run(fn, await httpInput(c), { kind: "http", method, path });
      if (outcome.ok && outcome.value instanceof HtmlText) return c.body(outcome.value.text, (outcome.status ?? 200) as 200, htmlType());
      if (outcome.ok) return c.body(outcome.text ?? jsonOf(outcome.value), (outcome.status ?? 200) as 200, jsonType());
      return c.body(errorBody(outcome.error.code, outcome.error.message), outcome.error.code as 400, jsonType());
    });
  }
  // What escapes a route (a client gone mid-request): a log line, not Hono's console output.
  app.onError((err, c) => {
    if (err instanceof HTTPException) return err.getResponse(); // the token guard's refusals
    env.log.warn({ method: c.req.method, path: c.req.path, err: err.message }, "HTTP request not answered");
    return c.body(errorBody(500, `the request could not be read: ${err.message}`), 500, jsonType());
  });
  app.notFound((c) => c.body(errorBody(404, `no function at ${c.req.method} ${c.req.path}`), 404, jsonType()));
  return app;
}

/** Listens on `host`:`port` (0: a free one); rejects saying a port in use. */
export function listen(app: Hono, host: string, port: number): Promise<ServerType> {
  return new Promise((resolve, reject) => {
    const server = serve({ fetch: app.fetch, hostname: host, port }, () => resolve(server));
    server.once("error", (err: NodeJS.ErrnoException) =>
      reject(
        new Error(
          err.code === "EADDRINUSE"
            ? `HTTP port ${port} on ${host} is in use: set HTTP_PORT to another port (0 picks a free one)`
            : `HTTP server cannot listen on ${host}:${port}: ${err.message}`,
          { cause: err },
        ),
      ),
    );
  });
}

/**
 * Closes the HTTP server: no new connection, idle ones closed now, those still busy after
 * `graceMs` closed too (a client that never finishes its request cannot hold stop).
 */
export async function closeHttp(http: ServerType, graceMs: number): Promise<void> {
  const server = http as Server;
  const closed = new Promise((resolve) => server.close(resolve));
  server.closeIdleConnections();
  const timer = setTimeout(() => server.closeAllConnections(), graceMs);
  await closed;
  clearTimeout(timer);
}
