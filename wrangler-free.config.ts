import { defineConfig } from "./runtime/index.ts";

/**
 * What differs per deployment. NATS_URL, NATS_CREDS, NATS_NKEY, NATS_USER, NATS_PASSWORD,
 * NATS_TOKEN, NATS_CA, NATS_CERT, NATS_KEY, HTTP_HOST and HTTP_PORT override the fields below
 * (docs/runtime.md §6); LOG_LEVEL sets the logs.
 */
export default defineConfig({
  seat: "mesh-provisioner",
  functions: "functions",
  state: ".state",

  // No servers: start the embedded nats-server, with its store under `state`.
  nats: { servers: [] },
  http: { host: "127.0.0.1", port: 8787 },

  // docs/buckets.md §2. Functions name buckets by these keys in their `access`.
  buckets: {
    registry: { bucket: "mesh-provisioner_registry", writtenBy: "seat", readBy: ["nodes"] },
    needs: { bucket: "mesh-provisioner_needs", writtenBy: "nodes", readBy: ["providers"] },
    applied: { bucket: "mesh-provisioner_applied", writtenBy: "nodes" },
    collect: { bucket: "mesh-provisioner_collect", writtenBy: "nodes" },
    failing: { bucket: "mesh-provisioner_failing", writtenBy: "seat" },
    // docs/state.md §7: the controller's assignments mirror, `<node>.<module>`; read, never written here.
    assignments: { bucket: "mesh-controller_assignments", writtenBy: "controller" },
    // docs/rotation.md §8.2: the newest rotation per provider, provision and (when named) holder.
    rotations: { bucket: "mesh-provisioner_rotations", writtenBy: "seat" },
    // docs/presence.md §16.1: each node's own key `<node>`, written by its client every few seconds.
    presence: { bucket: "mesh-provisioner_presence", writtenBy: "nodes", nodeKeys: "own" },
    // docs/presence.md §16.5: the newest check per node, module and provision, kept by the follower.
    checks: { bucket: "mesh-provisioner_checks", writtenBy: "seat" },
  },

  // docs/failing.md §5: providers' failing/recovered events, kept a week for the follower's durable consumers.
  streams: {
    events: { stream: "mesh-provisioner_events", maxAgeSeconds: 7 * 24 * 60 * 60 },
  },

  // docs/failing.md §5: what a provider publishes, `{provider}` being its name.
  // docs/rotation.md §8: what it publishes when it rotated a credential, where it learns the old one has no holder left,
  // and how it acknowledges that it did.
  providers: {
    publish: [
      "{provider}.provisioner.failing",
      "{provider}.provisioner.recovered",
      "{provider}.provisioner.rotated",
      "{provider}.provisioner.acknowledged",
    ],
    receive: ["mesh-provisioner.released.{provider}"],
  },

  // docs/rotation.md §8.5: where a node is told a provision it holds was rotated.
  // docs/presence.md §16.5: where a node publishes its checks (its own subject only).
  nodes: { publish: ["mesh-provisioner.checked.{node}"], receive: ["mesh-provisioner.refresh.{node}"] },

  // The embedded server's users besides the seat (the demo mesh's nodes and providers).
  embedded: {
    nodes: ["alder", "birch", "cedar", "dogwood"],
    providers: ["keycloak", "postgres", "mesh-vault"],
    controllers: ["mesh-controller"],
  },

  // docs/state.md §7: how long a module may be never-ran or pending before it is Late.
  provisioning: { graceSeconds: 600 },

  // docs/presence.md §16.1: how long a node may write no presence before it is unreachable (at least three of its own periods).
  presence: { ttlSeconds: 60 },

  // docs/rotation.md §8.4: how long a holder may stay stale, how long and how often stale nodes are noticed again,
  // and how often a release not acknowledged is published again.
  rotation: { graceSeconds: 300, renoticeMinutes: 60, renoticeEverySeconds: 60, releaseEverySeconds: 10 },

  // docs/failing.md §5, optional: raise failing providers to Prometheus Alertmanager.
  // alerts: { alertmanager: "http://127.0.0.1:9093" },

  // docs/registry.md §3: which domain answers which kind, and where a client finds the values.
  // Names in <…> are filled in by the client.
  registry: [
    { kinds: ["config"], module: "mesh-config", bucket: "mesh-config_values", key: "<node>.<module>.<name>" },
    { kinds: ["secret"], module: "mesh-vault", verb: "mesh-vault.secret" },
    {
      kinds: ["bound"],
      module: "<provider-module>",
      bucket: "<provider-module>_bound",
      key: "<node>.<module>.<provision>[.<local>]",
    },
    { kinds: ["consumers"], module: "mesh-vault", verb: "mesh-vault.consumers" },
    {
      kinds: ["collected"],
      module: "mesh-provisioner",
      bucket: "mesh-provisioner_collect",
      key: "<node>.<collection>.<contributor>",
      collection: "<name>",
    },
    {
      kinds: ["shell"],
      module: "mesh-provisioner",
      bucket: "mesh-provisioner_collect",
      key: "<node>.<collection>.<contributor>",
      collection: "shell:<name>",
    },
    {
      kinds: ["environment"],
      module: "mesh-provisioner",
      bucket: "mesh-provisioner_collect",
      key: "<node>.<collection>.<contributor>",
      collection: "environment:<name>",
    },
    {
      kinds: ["contribution"],
      module: "mesh-provisioner",
      bucket: "mesh-provisioner_collect",
      key: "<node>.<collection>.<contributor>",
      collection: "contribution:<name>",
    },
    {
      kinds: ["dir", "access", "port", "seat", "machine"],
      module: "mesh-controller",
      bucket: "mesh-controller_assignments",
      key: "<node>.<module>",
    },
  ],
});
