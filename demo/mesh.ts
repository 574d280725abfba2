/**
 * A small realistic mesh, as its node clients would record it: 4 nodes, 14 modules, needs of
 * every kind of docs/registry.md §3, applied records and collections. Keys follow docs/buckets.md §2.
 */

interface Placement {
  readonly module: string;
  /** The placeholders the module's files hold, and the file holding each. */
  readonly needs: Readonly<Record<string, string>>;
}

/** What runs where: each node's modules and their placeholders. */
export const PLACEMENTS: Readonly<Record<string, readonly Placement[]>> = {
  alder: [
    {
      module: "mesh-controller",
      needs: {
        "${dir:state}": "/etc/mesh-controller/controller.toml",
        "${port:api}": "/etc/mesh-controller/controller.toml",
        "${secret:signing_key}": "/etc/mesh-controller/keys.env",
      },
    },
    {
      module: "mesh-vault",
      needs: {
        "${dir:state}": "/etc/mesh-vault/vault.hcl",
        "${port:api}": "/etc/mesh-vault/vault.hcl",
        "${machine:hostname}": "/etc/mesh-vault/vault.hcl",
      },
    },
    {
      module: "mesh-config",
      needs: { "${dir:state}": "/etc/mesh-config/config.toml", "${port:api}": "/etc/mesh-config/config.toml" },
    },
    {
      module: "mesh-dns-resolver",
      needs: {
        "${config:upstream}": "/etc/unbound/unbound.conf",
        "${port:dns}": "/etc/unbound/unbound.conf",
        "${access:mesh-network}": "/etc/unbound/unbound.conf",
      },
    },
    { module: "zsh", needs: { "${shell:zsh:normal}": "/etc/zsh/zshrc", "${environment:posix}": "/etc/profile.d/mesh.sh" } },
  ],
  birch: [
    {
      module: "docker",
      needs: {
        "${seat:mesh-artifact-store:reach}": "/etc/docker/daemon.json",
        "${dir:data}": "/etc/docker/daemon.json",
        "${contribution:node-hotkeys:triggers}": "/etc/mesh/hotkeys.d/docker.json",
      },
    },
    {
      module: "gitea",
      needs: {
        "${config:app_name}": "/etc/gitea/app.ini",
        "${secret:admin_password}": "/etc/gitea/admin.env",
        "${bound:postgres:address}": "/etc/gitea/app.ini",
        "${port:http}": "/etc/gitea/app.ini",
        "${dir:state}": "/etc/gitea/app.ini",
        "${collected:ssh-keys}": "/var/lib/gitea/.ssh/authorized_keys",
      },
    },
    {
      module: "postgres",
      needs: {
        "${dir:data}": "/etc/postgresql/16/main/postgresql.conf",
        "${port:postgres}": "/etc/postgresql/16/main/postgresql.conf",
        "${secret:superuser_password}": "/etc/postgresql/16/main/superuser.env",
        "${consumers:roles}": "/etc/postgresql/16/main/pg_hba.conf",
      },
    },
    {
      module: "caddy",
      needs: {
        "${port:https}": "/etc/caddy/Caddyfile",
        "${collected:routes}": "/etc/caddy/Caddyfile",
        "${bound:keycloak:issuer}": "/etc/caddy/Caddyfile",
      },
    },
    { module: "zsh", needs: { "${shell:zsh:normal}": "/etc/zsh/zshrc", "${environment:posix}": "/etc/profile.d/mesh.sh" } },
  ],
  cedar: [
    {
      module: "keycloak",
      needs: {
        "${config:realm}": "/etc/keycloak/keycloak.conf",
        "${secret:admin_password}": "/etc/keycloak/admin.env",
        "${bound:postgres:address}": "/etc/keycloak/keycloak.conf",
        "${port:http}": "/etc/keycloak/keycloak.conf",
        "${consumers:clients}": "/etc/keycloak/clients.json",
      },
    },
    {
      module: "postgres",
      needs: {
        "${dir:data}": "/etc/postgresql/16/main/postgresql.conf",
        "${port:postgres}": "/etc/postgresql/16/main/postgresql.conf",
        "${secret:superuser_password}": "/etc/postgresql/16/main/superuser.env",
      },
    },
    {
      module: "mesh-artifact-store",
      needs: { "${dir:store}": "/etc/zot/config.json", "${port:registry}": "/etc/zot/config.json" },
    },
    { module: "zsh", needs: { "${shell:zsh:normal}": "/etc/zsh/zshrc", "${environment:posix}": "/etc/profile.d/mesh.sh" } },
  ],
  dogwood: [
    {
      module: "prometheus",
      needs: {
        "${port:http}": "/etc/prometheus/prometheus.yml",
        "${dir:tsdb}": "/etc/default/prometheus",
        "${collected:scrape-targets}": "/etc/prometheus/prometheus.yml",
      },
    },
    {
      module: "grafana",
      needs: {
        "${config:domain}": "/etc/grafana/grafana.ini",
        "${secret:admin_password}": "/etc/grafana/grafana.ini",
        "${bound:keycloak:issuer}": "/etc/grafana/grafana.ini",
        "${port:http}": "/etc/grafana/grafana.ini",
        "${contribution:node-hotkeys:triggers}": "/etc/mesh/hotkeys.d/grafana.json",
      },
    },
    {
      module: "node-exporter",
      needs: {
        "${port:metrics}": "/etc/default/prometheus-node-exporter",
        "${machine:hostname}": "/etc/default/prometheus-node-exporter",
        "${access:host-proc}": "/etc/default/prometheus-node-exporter",
      },
    },
    {
      module: "docker",
      needs: { "${seat:mesh-artifact-store:reach}": "/etc/docker/daemon.json", "${dir:data}": "/etc/docker/daemon.json" },
    },
    { module: "zsh", needs: { "${shell:zsh:normal}": "/etc/zsh/zshrc", "${environment:posix}": "/etc/profile.d/mesh.sh" } },
  ],
};

/** Items of collections, per node: collection name → contributor → item. */
const COLLECTIONS: Readonly<Record<string, Readonly<Record<string, Readonly<Record<string, unknown>>>>>> = {
  alder: {
    "shell:zsh:normal": { "mesh-controller": { lines: ["alias mc='mesh-controller'"] } },
    "environment:posix": { "mesh-controller": { vars: { MESH_CONTROLLER: "https://alder:7400" } } },
  },
  birch: {
    "shell:zsh:normal": {
      docker: { lines: ["alias dps='docker ps --format \"{{.Names}}\"'"] },
      gitea: { lines: ["alias gitea-admin='sudo -u git gitea admin'"] },
    },
    "environment:posix": { docker: { vars: { DOCKER_BUILDKIT: "1" } } },
    "contribution:node-hotkeys:triggers": { docker: { triggers: [{ key: "F9", run: "docker ps" }] } },
    routes: {
      gitea: { host: "git.mesh", upstream: "127.0.0.1:3000" },
      caddy: { host: "status.mesh", respond: "ok" },
    },
    "ssh-keys": { gitea: { keys: ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGitea deploy@birch"] } },
  },
  cedar: {
    "shell:zsh:normal": { keycloak: { lines: ["alias kcadm='/opt/keycloak/bin/kcadm.sh'"] } },
    "environment:posix": { keycloak: { vars: { KC_HOME: "/opt/keycloak" } } },
  },
  dogwood: {
    "shell:zsh:normal": { prometheus: { lines: ["alias promtool-check='promtool check config /etc/prometheus/prometheus.yml'"] } },
    "contribution:node-hotkeys:triggers": { grafana: { triggers: [{ key: "F10", open: "http://dogwood:3000" }] } },
    "scrape-targets": {
      "node-exporter": { targets: ["dogwood:9100"] },
      prometheus: { targets: ["dogwood:9090"] },
    },
  },
};

/**
 * What makes each provisioning state and condition of docs/state.md §7 show in the demo: the
 * modules the controller assigns besides those placed, those it does not, how a pass ended, and
 * the needs that name their provider module or a kind no domain answers.
 */
export const CASES = {
  /** Assigned, and never run on that node: `never-ran`. */
  neverRan: { node: "birch", module: "backup" },
  /** Assigned, ran, and declares nothing: `declares-nothing`. */
  declaresNothing: { node: "cedar", module: "motd" },
  /** Needs written after its last applied record: `pending`. */
  pending: { node: "dogwood", module: "node-exporter" },
  /** Its last pass failed: `failed`. */
  failed: { node: "cedar", module: "mesh-artifact-store", error: "zot: listen tcp :5000: address already in use" },
  /** Left behind on a node it is no longer assigned to: `unassigned`. */
  unassigned: { node: "alder", module: "old-backup" },
  /**
   * A holder of the provider's one login on another revision than the provider applied:
   * `RevisionMismatch` (docs/presence.md §16.6), the frozen password.
   */
  revisionMismatch: { node: "birch", holder: "gitea", provider: "postgres", provision: "postgres", held: "pg-2", applied: "pg-3" },
} as const;

/** Needs beyond the placements' files, by node and module: a kind no domain answers, providers named (not assigned anywhere, not ready). */
const EXTRA_NEEDS: Readonly<Record<string, Readonly<Record<string, Readonly<Record<string, Readonly<Record<string, unknown>>>>>>>> = {
  birch: {
    gitea: {
      "${wormhole:exit}": { file: "/etc/gitea/app.ini" },
      "${bound:redis:address}": { file: "/etc/gitea/app.ini", provider: "redis" },
      "${bound:postgres:address}": { file: "/etc/gitea/app.ini", provider: "postgres" },
    },
    docker: { "${seat:mesh-artifact-store:reach}": { file: "/etc/docker/daemon.json", provider: "mesh-artifact-store" } },
  },
  alder: { "old-backup": { "${dir:archive}": { file: "/etc/restic/restic.env" } } },
};

/** The controller's assignments (`<node>.<module>`): every placed module but the one left behind, and the one that never ran. */
export function assignmentsOf(): { key: string; value: unknown }[] {
  const placed = Object.entries(PLACEMENTS).flatMap(([node, placements]) => placements.map((p) => `${node}.${p.module}`));
  return [...placed, `${CASES.neverRan.node}.${CASES.neverRan.module}`, `${CASES.declaresNothing.node}.${CASES.declaresNothing.module}`]
    .filter((key) => key !== `${CASES.unassigned.node}.${CASES.unassigned.module}`)
    .sort()
    .map((key) => ({ key, value: { module: key.split(".")[1], plan: "as the controller placed it" } }));
}

/** Records out of their bucket's shape, as a client with a bug would write them (of the needs bucket). */
export const STRAY: Readonly<Record<string, readonly { key: string; value: unknown }[]>> = {
  dogwood: [{ key: "dogwood.grafana.config", value: { placeholder: "${config}" } }],
};

const APPLIED_AT = "2026-11-29T08:00:00.000Z";

/** One step of a node's client in the demo: declare a module's placeholders, write its applied record, contribute items. */
export interface DemoStep {
  readonly module: string;
  /** Each placeholder with what its need's value holds besides it. */
  readonly declare?: Readonly<Record<string, Readonly<Record<string, unknown>>>>;
  readonly applied?: Readonly<Record<string, unknown>> & { readonly error?: string };
  /** Collection, contributor, item. */
  readonly contribute?: readonly (readonly [string, string, unknown])[];
}

/** The `revisions` of a module's applied record in the demo: the provider's and its holder's of {@link CASES}.revisionMismatch. */
function revisionsOf(node: string, module: string): { revisions?: Record<string, string> } {
  const { node: at, holder, provider, provision, held, applied } = CASES.revisionMismatch;
  if (node !== at) return {};
  if (module === provider) return { revisions: { [provision]: applied } };
  if (module === holder) return { revisions: { [provision]: held } };
  return {};
}

/** What `node`'s client does in the demo, in order (docs/client.md §9.1). */
export function demoMesh(node: string): DemoStep[] {
  const steps: DemoStep[] = [];
  const placements = [
    ...(PLACEMENTS[node] ?? []),
    ...(node === CASES.unassigned.node ? [{ module: CASES.unassigned.module, needs: {} }] : []),
    ...(node === CASES.declaresNothing.node ? [{ module: CASES.declaresNothing.module, needs: {} }] : []),
  ];
  for (const { module, needs } of placements) {
    const declare = {
      ...Object.fromEntries(Object.entries(needs).map(([placeholder, file]) => [placeholder, { file }])),
      ...(EXTRA_NEEDS[node]?.[module] ?? {}),
    };
    const applied = {
      at: APPLIED_AT,
      placeholders: Object.keys(needs).length,
      files: [...new Set(Object.values(needs))],
      ...(node === CASES.failed.node && module === CASES.failed.module ? { error: CASES.failed.error } : {}),
      ...revisionsOf(node, module),
    };
    // The pending module's client wrote its applied record, then new needs it has not applied yet
    // (declared anew, so they are newer than the applied record on every run of the demo).
    const pending = node === CASES.pending.node && module === CASES.pending.module;
    steps.push(
      ...(pending
        ? [
            { module, declare: {} },
            { module, applied },
            { module, declare },
          ]
        : [{ module, declare, applied }]),
    );
  }
  const contribute = Object.entries(COLLECTIONS[node] ?? {}).flatMap(([collection, items]) =>
    Object.entries(items).map(([contributor, item]) => [collection, contributor, item] as const),
  );
  if (contribute.length > 0) steps.push({ module: "", contribute });
  return steps;
}

/** The nodes of the demo mesh. */
export const NODES = Object.keys(PLACEMENTS);

/**
 * The demo's failing provider: keycloak (the identity provider, on cedar) fails grafana, its
 * consumer on dogwood, as it would publish on `keycloak.provisioner.failing` (docs/failing.md §5).
 */
export const DEMO_FAILING = {
  provider: "keycloak",
  machine: "dogwood",
  consumer: "grafana",
  word: "invalid_client: grafana's client secret was rotated on keycloak, not on dogwood",
} as const;

/**
 * The demo's rotation (docs/rotation.md §8): keycloak rotates grafana's client secret, the
 * credential of that one holder, as it would publish on `keycloak.provisioner.rotated`.
 */
export const DEMO_ROTATION = {
  provider: "keycloak",
  provision: "keycloak",
  revision: "grafana-client-2",
  machine: "dogwood",
  consumer: "grafana",
} as const;
