import type { NatsConnection } from "nats";
import prettyBytes from "pretty-bytes";
import { STATUS, type Events, type Status } from "../functions/_lib/status.ts";
import { askVerb, failingFor, shown, table } from "./ask.ts";
import { formatStates } from "./state.ts";

/** Asks `mesh-provisioner.status` once (docs/failing.md §5) with a narrowing. */
export function askStatus(nc: NatsConnection, narrowing: Record<string, unknown>): Promise<Status> {
  return askVerb<Status>(nc, STATUS, narrowing);
}

const WIDEST_WORD = 80;

/** Status as a person reads it: well or not, a table of what fails and for how long, the registry. */
export function formatStatus(status: Status, now: Date): string {
  const lines: string[] = [];
  const failing = status.failing.length + status.outOfShape.length;
  const modules = status.provisioning.notWell.length + status.provisioning.omitted;
  const notWell = [
    ...(failing > 0 ? [`${failing} failing`] : []),
    ...(status.stale.length > 0 ? [`${status.stale.length} stale holder${status.stale.length === 1 ? "" : "s"}`] : []),
    ...(modules > 0 ? [`${modules} module${modules === 1 ? "" : "s"} not well`] : []),
    ...(status.checks.failing > 0 ? [`${status.checks.failing} check${status.checks.failing === 1 ? "" : "s"} failing`] : []),
    ...(status.nodes.counts.unreachable > 0
      ? [`${status.nodes.counts.unreachable} node${status.nodes.counts.unreachable === 1 ? "" : "s"} unreachable`]
      : []),
    ...(status.events.recording ? [] : ["events cannot be recorded"]),
  ];
  lines.push(status.well ? "WELL: nothing fails" : `NOT WELL: ${notWell.join("; ") || "see below"}`);
  if (!status.events.recording) lines.push(`events: ${status.events.reason}`);
  if (status.failing.length > 0) {
    lines.push(
      "",
      ...table([
        ["PROVIDER", "MACHINE", "CONSUMER", "FAILING FOR", "WORD"],
        ...status.failing.map((f) => [f.provider, f.machine, f.consumer, failingFor(f.since, now), shown(f.word, WIDEST_WORD)]),
      ]),
    );
  }
  if (status.stale.length > 0) {
    lines.push(
      "",
      ...table([
        ["PROVIDER", "PROVISION", "NODE", "MODULE", "HOLDS", "SHOULD HOLD", "ROTATED"],
        ...status.stale.map((h) => [
          h.provider,
          h.provision,
          h.node,
          h.module,
          shown(h.heldRevision ?? "-", WIDEST_WORD),
          shown(h.revision, WIDEST_WORD),
          `${failingFor(h.rotatedAt, now)} ago`,
        ]),
      ]),
    );
  }
  // Left out to fit one reply: stale holders first, then keys out of shape, then failing triples (docs/failing.md §5.6).
  if (status.omitted > 0)
    lines.push(`… and ${status.omitted} more left out to fit one reply (narrow with --provider, --machine or --consumer)`);
  if (status.outOfShape.length > 0) {
    lines.push(
      "",
      `out of shape (${status.outOfShape.length}):`,
      ...status.outOfShape.map((o) => `  ${shown(o.key, 200)}: ${shown(o.reason, 200)}`),
    );
  }
  if (status.nodes.unreachable.length > 0) {
    lines.push(
      "",
      ...table([
        ["NODE", "UNREACHABLE FOR", "LAST SEEN"],
        ...status.nodes.unreachable.map((n) => [n.node, failingFor(n.since, now), `${failingFor(n.lastSeen, now)} ago`]),
      ]),
    );
  }
  if (status.provisioning.notWell.length > 0) {
    lines.push("", ...formatStates({ entries: status.provisioning.notWell, outOfShape: [] }, now).split("\n").slice(0, -1));
  }
  if (status.provisioning.omitted > 0) lines.push(`… and ${status.provisioning.omitted} more modules (see: mesh-provisioner state)`);
  const { kinds, compiledAt } = status.registry;
  lines.push(
    "",
    `registry: ${kinds.length} kinds, ${compiledAt === null ? "never compiled" : `compiled ${failingFor(compiledAt, now)} ago (${compiledAt})`}`,
    `rejected events: ${status.rejectedEvents}`,
    ...nodeLines(status.nodes.counts),
    ...eventLines(status.events),
  );
  return lines.join("\n");
}

/** The nodes by presence, when any node is known (docs/presence.md §16.3). */
function nodeLines(counts: Status["nodes"]["counts"]): string[] {
  const { reachable, unreachable, silent } = counts;
  return reachable + unreachable + silent === 0 ? [] : [`nodes: ${reachable} reachable, ${unreachable} unreachable, ${silent} silent`];
}

/** The events stream and the account against their limits, and what the follower has not handled yet. */
function eventLines(events: Events): string[] {
  const bytes = (n: number) => prettyBytes(n, { binary: true });
  const of = (use: { bytes: number; maxBytes: number | null }, none: string) =>
    use.maxBytes === null ? `${bytes(use.bytes)} (${none})` : `${bytes(use.bytes)} of ${bytes(use.maxBytes)}`;
  const { stream, account, pending, unacknowledged, ackWaitSeconds } = events;
  return [
    ...(stream === null ? [] : [`events stream ${stream.name}: ${stream.messages} events, ${of(stream, "no limit")}`]),
    ...(account === null ? [] : [`account storage: ${of(account, "no limit of its own: the server's applies")}`]),
    ...(pending > 0 ? [`${pending} events not handled yet`] : []),
    ...(unacknowledged > 0
      ? [
          `${unacknowledged} events delivered to a replica and not acknowledged yet: not in status until handled` +
            (ackWaitSeconds === null ? "" : ` (a replica that stopped holds them for up to ${ackWaitSeconds} s)`),
        ]
      : []),
  ];
}
