import pRetry, { AbortError } from "p-retry";
import { z } from "zod";
import type { KeyRecord } from "../../runtime/index.ts";
import { keptOf } from "./follower.ts";
import { decodeKey } from "../../contract/keys.ts";
import type { StaleHolder } from "./rotation.ts";
import type { ModuleState } from "./state.ts";
import type { Check } from "./checks.ts";
import { DEFAULT_CHECK_REASON } from "../../contract/events.ts";

/** The alert name every failing triple is raised under. */
export const ALERTNAME = "ProvisioningFailing";
/** How long after a recovery its resolution is still sent, in milliseconds. */
export const RESOLVED_FOR_MS = 60 * 60 * 1000;

/**
 * `alerts` of `wrangler-free.config.ts` (docs/failing.md §5, optional): with `alertmanager` (its base URL)
 * set, failing triples are raised there. `retries` and `backoffMs` shape the retries of one
 * sending; `timeoutMs` bounds each request.
 */
export const alertsConfig = z.object({
  alerts: z
    .strictObject({
      alertmanager: z.url({ protocol: /^https?$/, error: "must be the http(s) URL of Alertmanager" }).optional(),
      retries: z.number().int().min(0).max(10).default(3),
      backoffMs: z.number().int().min(1).default(1000),
      timeoutMs: z.number().int().min(1).default(5000),
    })
    .default({ retries: 3, backoffMs: 1000, timeoutMs: 5000 }),
});
export type AlertsConfig = z.output<typeof alertsConfig>["alerts"];

/** An alert as Alertmanager's API v2 takes it (`POST /api/v2/alerts`). */
export interface PostableAlert {
  readonly labels: Record<string, string>;
  readonly annotations: Record<string, string>;
  readonly startsAt: string;
  readonly endsAt?: string;
}

/** A time as Alertmanager takes it: ISO in UTC, and never after `now` (a provider's clock may run ahead). */
const notLater = (at: string, now: Date) => new Date(Math.min(Date.parse(at), now.getTime())).toISOString();

/**
 * The alerts for the failing bucket's records (live keys and delete markers): a firing alert
 * per failing triple (`startsAt` its `since`, no `endsAt`, so Alertmanager keeps it while it is
 * sent again), and a resolved one (`endsAt` its recovery) per triple recovered within
 * {@link RESOLVED_FOR_MS} of `now`. Labels: `alertname`, `provider`, `machine`, `consumer`.
 */
export function alertsOf(records: readonly KeyRecord[], now: Date): PostableAlert[] {
  const alerts: PostableAlert[] = [];
  for (const record of records) {
    const decoded = decodeKey("failing", record.key);
    if (!decoded.ok) continue;
    const { provider, machine, consumer } = decoded.fields;
    const labels = { alertname: ALERTNAME, provider, machine, consumer };
    const kept = keptOf(record);
    if (kept.state === "failing") {
      alerts.push({
        labels,
        annotations: { word: kept.word, summary: `${provider} fails ${consumer} on ${machine}: ${kept.word}` },
        startsAt: notLater(kept.since, now),
      });
    } else if (kept.state === "recovered" && now.getTime() - Date.parse(kept.at) <= RESOLVED_FOR_MS) {
      const endsAt = notLater(kept.at, now);
      alerts.push({
        labels,
        annotations: { summary: `${provider} serves ${consumer} on ${machine} again` },
        startsAt: kept.since ? notLater(kept.since, now) : endsAt,
        endsAt,
      });
    }
  }
  return alerts;
}

/**
 * Posts `alerts` to `<alertmanager>/api/v2/alerts` (a user and password in the URL are sent as
 * Basic authorization, never shown in an error), retrying a failed request (unreachable,
 * timed out, or a 5xx/429 answer) `retries` times with exponential backoff from `backoffMs`.
 * A 4xx answer is not retried. Throws the last error when every attempt failed.
 */
export async function postAlerts(config: AlertsConfig & { alertmanager: string }, alerts: readonly PostableAlert[]): Promise<void> {
  const { url, headers } = endpoint(config.alertmanager);
  await pRetry(
    async () => {
      const response = await fetch(url, {
        method: "POST",
        headers,
        body: JSON.stringify(alerts),
        signal: AbortSignal.timeout(config.timeoutMs),
      }).catch((err: Error & { cause?: Error }) => {
        throw new Error(`Alertmanager at ${url} cannot be reached: ${err.cause?.message ?? err.message}`);
      });
      if (response.ok) return;
      const error = new Error(`Alertmanager at ${url} answered ${response.status}: ${(await response.text()).slice(0, 200)}`);
      throw response.status >= 500 || response.status === 429 ? error : new AbortError(error);
    },
    { retries: config.retries, minTimeout: config.backoffMs, factor: 2, randomize: true },
  );
}

/**
 * The label `seat` of the alerts of modules, stale holders, nodes and checks: what tells them from
 * another system's of the same name in one Alertmanager, so that the set ends only its own
 * ({@link heldAlerts}).
 */
export const SEAT = "mesh-provisioner";

/** The alert name every module that counts against the mesh is raised under (docs/state.md §7.6). */
export const MODULE_ALERTNAME = "ProvisioningNotWell";

/** The alert name every holder stale past its rotation's grace is raised under (docs/rotation.md §8.3). */
export const STALE_ALERTNAME = "ProvisioningStale";

/**
 * The firing alerts of the modules that count against the mesh (docs/state.md §7.6), by module
 * key: labels `alertname`, `node`, `module`, `state`, `condition` (its first condition's type,
 * or `none`); `startsAt` its state's `since`.
 */
export function moduleAlerts(notWell: readonly ModuleState[], now: Date): Map<string, PostableAlert> {
  const firing = new Map<string, PostableAlert>();
  for (const m of notWell) {
    const condition = m.conditions[0];
    firing.set(`module:${m.key}`, {
      labels: {
        alertname: MODULE_ALERTNAME,
        seat: SEAT,
        node: m.node,
        module: m.module,
        state: m.state,
        condition: condition?.type ?? "none",
      },
      annotations: {
        summary: `${m.module} on ${m.node} is ${m.state}${condition === undefined ? "" : `: ${condition.type}: ${condition.message}`}`,
      },
      startsAt: notLater(m.since, now),
    });
  }
  return firing;
}

/**
 * The firing alerts of the holders stale past their rotation's grace (docs/rotation.md §8.3), by
 * holder: labels `alertname`, `provider`, `provision`, `node`, `module`, `revision`; `startsAt`
 * when the rotation arrived.
 */
export function staleAlerts(stale: readonly StaleHolder[], now: Date): Map<string, PostableAlert> {
  const firing = new Map<string, PostableAlert>();
  for (const h of stale) {
    firing.set(`stale:${h.provider}.${h.key}`, {
      labels: {
        alertname: STALE_ALERTNAME,
        seat: SEAT,
        provider: h.provider,
        provision: h.provision,
        node: h.node,
        module: h.module,
        revision: h.revision,
      },
      annotations: {
        summary: `${h.module} on ${h.node} holds ${h.heldRevision ?? "no revision"} of ${h.provision}, rotated to ${h.revision} by ${h.provider}`,
      },
      startsAt: notLater(h.rotatedAt, now),
    });
  }
  return firing;
}

/** The alert name every unreachable node is raised under (docs/presence.md §16.3). */
export const NODE_ALERTNAME = "NodeUnreachable";

/** The firing alerts of the unreachable nodes (docs/presence.md §16.3), by node: label `node`; `startsAt` when it became unreachable. */
export function nodeAlerts(
  unreachable: readonly { node: string; since: string; lastSeen: string }[],
  now: Date,
): Map<string, PostableAlert> {
  const firing = new Map<string, PostableAlert>();
  for (const n of unreachable) {
    firing.set(`node:${n.node}`, {
      labels: { alertname: NODE_ALERTNAME, seat: SEAT, node: n.node },
      annotations: { summary: `node ${n.node} is unreachable: no presence since ${n.lastSeen}` },
      startsAt: notLater(n.since, now),
    });
  }
  return firing;
}

/** The alert name every failing check is raised under (docs/presence.md §16.5). */
export const CHECK_ALERTNAME = "ProvisioningCheckFailing";

/**
 * The firing alerts of the failing checks (docs/presence.md §16.5), by check key: labels `node`,
 * `module`, `provision`, `reason`; `startsAt` its streak's start.
 */
export function checkAlerts(failing: readonly Check[], now: Date): Map<string, PostableAlert> {
  const firing = new Map<string, PostableAlert>();
  for (const c of failing) {
    if (c.ok) continue;
    const reason = c.reason ?? DEFAULT_CHECK_REASON;
    firing.set(`check:${c.key}`, {
      labels: { alertname: CHECK_ALERTNAME, seat: SEAT, node: c.node, module: c.module, provision: c.provision, reason },
      annotations: {
        summary: `${c.module} on ${c.node} fails its check of ${c.provision}: ${reason}${c.message === null ? "" : `: ${c.message}`}`,
      },
      startsAt: notLater(c.since, now),
    });
  }
  return firing;
}

/**
 * What to send of `firing` (by key) given what was `raised` before by this process and what
 * Alertmanager still `held` ({@link heldAlerts}): every firing alert, and a resolved one (`endsAt`
 * now) for each raised or held alert whose labels no longer fire. Returns the alerts and what is
 * raised after them, to hand to the next call.
 */
export function raisedAlerts(
  firing: ReadonlyMap<string, PostableAlert>,
  raised: ReadonlyMap<string, PostableAlert>,
  now: Date,
  held: readonly PostableAlert[] = [],
): { alerts: PostableAlert[]; raised: Map<string, PostableAlert> } {
  const fires = new Set([...firing.values()].map((a) => labelsKey(a.labels)));
  const resolved = new Map<string, PostableAlert>();
  for (const alert of [...raised.values(), ...held]) {
    const id = labelsKey(alert.labels);
    if (fires.has(id) || resolved.has(id)) continue;
    resolved.set(id, { labels: alert.labels, annotations: alert.annotations, startsAt: alert.startsAt, endsAt: now.toISOString() });
  }
  return { alerts: [...firing.values(), ...resolved.values()], raised: new Map(firing) };
}

/** One alert's identity, as Alertmanager's: its labels, in any order. */
const labelsKey = (labels: Readonly<Record<string, string>>) => JSON.stringify(Object.entries(labels).sort(([a], [b]) => (a < b ? -1 : 1)));

/** An alert as Alertmanager's API v2 lists it (`GET /api/v2/alerts`): what resolving it takes. */
const gettableAlerts = z.array(
  z.object({ labels: z.record(z.string(), z.string()), annotations: z.record(z.string(), z.string()).default({}), startsAt: z.string() }),
);

/**
 * The alerts named `names` and labelled `seat` {@link SEAT} that Alertmanager at
 * `config.alertmanager` holds unresolved (`GET /api/v2/alerts`, silenced and inhibited ones
 * included), within one `timeoutMs`: what an earlier
 * process or another replica raised, for {@link raisedAlerts} to resolve once they no longer
 * fire. Throws naming Alertmanager when it cannot be asked or answers something else.
 */
export async function heldAlerts(config: AlertsConfig & { alertmanager: string }, names: readonly string[]): Promise<PostableAlert[]> {
  const { url, headers } = endpoint(config.alertmanager);
  url.searchParams.append("filter", `alertname=~"^(${names.join("|")})$"`);
  url.searchParams.append("filter", `seat="${SEAT}"`);
  const response = await fetch(url, { headers, signal: AbortSignal.timeout(config.timeoutMs) }).catch((err: Error & { cause?: Error }) => {
    throw new Error(`Alertmanager at ${url.origin} cannot be reached: ${err.cause?.message ?? err.message}`);
  });
  if (!response.ok) throw new Error(`Alertmanager at ${url.origin} answered ${response.status} to the list of its alerts`);
  const listed = gettableAlerts.safeParse(await response.json().catch(() => undefined));
  if (!listed.success) throw new Error(`Alertmanager at ${url.origin} listed its alerts in another shape than its API v2`);
  // As the filters asked: the set's own, of those names.
  return listed.data.filter((a) => a.labels.seat === SEAT && names.includes(a.labels.alertname ?? ""));
}

/** `<alertmanager>/api/v2/alerts`, with a user and password of the URL moved to a Basic authorization header. */
function endpoint(alertmanager: string): { url: URL; headers: Record<string, string> } {
  const url = new URL("api/v2/alerts", alertmanager.endsWith("/") ? alertmanager : `${alertmanager}/`);
  // fetch takes no credentials in a URL: they go in a Basic header, and out of every message.
  const headers: Record<string, string> = { "content-type": "application/json" };
  if (url.username !== "") {
    headers.authorization = `Basic ${Buffer.from(`${decodeURIComponent(url.username)}:${decodeURIComponent(url.password)}`).toString("base64")}`;
  }
  url.username = "";
  url.password = "";
  return { url, headers };
}
