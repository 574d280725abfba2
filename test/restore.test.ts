import { cpSync, existsSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { NatsConnection } from "nats";
import { afterAll, describe, expect, it } from "vitest";
import { authorization, loadFunctions, start, type Config, type Running } from "../runtime/index.ts";
import { startEmbedded, type EmbeddedServer } from "../runtime/embedded.ts";
import { connectTo } from "../runtime/session.ts";
import { projectConfig, request, until } from "./helpers.ts";

// docs/backup.md §19: the state folder of a stopped server copied, the copy is all there is; a
// server and a set started on the copy answer as they did.
const folders: string[] = [];
const opened: NatsConnection[] = [];
let server: EmbeddedServer | undefined;
let set: Running | undefined;
afterAll(async () => {
  await Promise.all(opened.map((nc) => nc.close().catch(() => {})));
  await set?.stop();
  await server?.stop();
  for (const dir of folders) rmSync(dir, { recursive: true, force: true });
});

const folder = (name: string) => {
  const dir = mkdtempSync(join(tmpdir(), `mesh-provisioner-${name}-`));
  folders.push(dir);
  return dir;
};

describe("a restore (docs/backup.md §19.2)", () => {
  it("of a stopped server's state folder answers the verb and status as before", async () => {
    const config = await projectConfig();
    const users = authorization(config, await loadFunctions(config), {
      nodes: config.embedded.nodes,
      providers: config.embedded.providers,
      controllers: config.embedded.controllers,
    });
    const seatOf = (s: EmbeddedServer): Config => ({
      ...config,
      nats: { servers: [s.url], user: s.seat.user, password: s.seat.password },
      http: { host: "127.0.0.1", port: 0 },
    });
    const as = async (user: string) => {
      const { password } = user === server!.seat.user ? server!.seat : server!.users[user]!;
      const nc = await connectTo([server!.url], { user, pass: password });
      opened.push(nc);
      return nc;
    };
    const kv = async (user: string, bucket: string) =>
      (await as(user)).jetstream().views.kv(config.buckets[bucket]!.bucket, { bindOnly: true });

    const original = folder("original");
    server = await startEmbedded({ stateDir: original, users });
    set = await start({ config: seatOf(server) });
    // What a mesh writes: the controller's assignments, a node's needs and applied records, a
    // provider's failing, a node's check.
    const assignments = await kv(config.embedded.controllers[0]!, "assignments");
    await assignments.put("alder.gitea", JSON.stringify({ plan: { module: "gitea" } }));
    await assignments.put("birch.zot", JSON.stringify({ plan: { module: "zot" } }));
    const alderNeeds = await kv("alder", "needs");
    await alderNeeds.put("alder.gitea.bound.postgres/gitea", "{}");
    await alderNeeds.put("alder.gitea.config.db_url", JSON.stringify({ file: "/etc/gitea/app.ini" }));
    await (await kv("alder", "applied")).put("alder.gitea", JSON.stringify({ revisions: { postgres: "7" } }));
    await (await kv("birch", "applied")).put("birch.zot", JSON.stringify({ error: "port 5000 is taken" }));
    await (
      await as("keycloak")
    )
      .jetstream()
      .publish(
        "keycloak.provisioner.failing",
        JSON.stringify({ machine: "alder", consumer: "gitea", word: "invalid_client", at: new Date().toISOString() }),
      );
    await (
      await as("alder")
    )
      .jetstream()
      .publish(
        "mesh-provisioner.checked.alder",
        JSON.stringify({ module: "gitea", provision: "postgres", ok: false, reason: "AuthFailed", at: new Date().toISOString() }),
      );
    const answersOf = async (nc: NatsConnection) => {
      const verb = async (what: string) => (await request(nc, "mesh-provisioner.provisioning", { what })).body;
      const status = (await request(nc, "mesh-provisioner.status", {})).body;
      return {
        needs: await verb("needs"),
        applied: await verb("applied"),
        registry: await verb("registry"),
        state: await verb("state"),
        checks: await verb("checks"),
        failing: status.failing,
        notWell: status.provisioning.notWell,
      };
    };
    const asker = await as(server.seat.user);
    const answers = () => answersOf(asker);
    await until(async () => {
      const now = await answers();
      return now.failing.length === 1 && now.checks.entries.length === 1;
    });
    const before = await answers();
    expect(before.needs.entries).toHaveLength(2);
    expect(before.notWell.map((m: { key: string }) => m.key)).toEqual(["alder.gitea", "birch.zot"]);

    // Stopped, copied, the original removed.
    await set.stop();
    set = undefined;
    await Promise.all(opened.splice(0).map((nc) => nc.close()));
    await server.stop();
    const copy = folder("restored");
    cpSync(original, copy, { recursive: true });
    rmSync(original, { recursive: true, force: true });
    expect(readdirSync(copy).sort()).toEqual(expect.arrayContaining(["jetstream", "users.json"]));

    server = await startEmbedded({ stateDir: copy, users });
    set = await start({ config: seatOf(server) });
    const after = await answersOf(await as(server.seat.user));
    expect(after).toEqual(before);
    expect(existsSync(original)).toBe(false);
  });
});
