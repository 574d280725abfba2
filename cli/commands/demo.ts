import { Option } from "commander";
import { HOLDERS, ROTATIONS, type What } from "../../functions/_lib/provisioning.ts";
import { openSession } from "../../runtime/index.ts";
import { askAll, formatAnswer, type AskRequest } from "../ask.ts";
import {
  catchUpDemo,
  DEMO_FAILING,
  DEMO_ROTATION,
  demoBus,
  failDemoCheck,
  publishDemoEvent,
  publishDemoRotation,
  silenceDemoNode,
  writeDemo,
} from "../demo.ts";
import { askChecks, formatChecks } from "../checks.ts";
import { PRESENCE_EVERY_SECONDS } from "../../contract/presence.ts";
import type { AddCommand } from "../program.ts";
import { formatHolders, formatRotations } from "../rotation.ts";
import { askStatus, formatStatus } from "../status.ts";

/** The requests the demo asks after the failing, each printed as `ask` prints it. */
const DEMO_REQUESTS: readonly AskRequest<What>[] = [
  { what: "registry" },
  { what: "needs", node: "birch", module: "gitea" },
  { what: "collect", collection: "shell:zsh:normal" },
  { what: "needs", node: "dogwood", module: "grafana" },
];

/**
 * `demo`: writes the demo mesh as its clients would, has its provider fail a consumer and rotate a
 * credential, and asks about it (docs/failing.md §5, docs/rotation.md §8); `--recover` and
 * `--catch-up` take the next steps.
 */
export const demoCommand: AddCommand = (program, { config }) => {
  program
    .command("demo")
    .description("write the demo mesh as its node clients would, have its identity provider fail a consumer, then ask about it")
    // Each step alone: one run takes one of them.
    .addOption(
      new Option("--recover", `only publish the recovery of ${DEMO_FAILING.provider}, then print status`).conflicts(["catchUp", "silence"]),
    )
    .addOption(
      new Option(
        "--catch-up",
        `only catch ${DEMO_ROTATION.consumer} on ${DEMO_ROTATION.machine} up with the rotated credential, then print the release`,
      ).conflicts(["silence"]),
    )
    .option(
      "--silence <node>",
      "only have a node's client write its presence once and stop: the node is unreachable after presence.ttlSeconds",
    )
    .option(
      "--users <file>",
      "the passwords of the demo's node, provider and controller users (the shape of .state/users.json): needed on a server of your own (NATS_URL)",
    )
    .action(async (options: { recover?: boolean; catchUp?: boolean; silence?: string; users?: string }) => {
      const cfg = await config();
      const bus = await demoBus(cfg, options.users);
      const session = await openSession(cfg, { embedded: "join", name: "mesh-provisioner demo" });
      const { provider, machine, consumer } = DEMO_FAILING;
      const showStatus = async () => {
        console.log("\n$ status");
        console.log(formatStatus(await askStatus(session.nc, {}), new Date()));
      };
      try {
        if (options.recover) {
          await publishDemoEvent(bus, "recovered");
          console.log(`${provider}: published ${provider}.provisioner.recovered for ${consumer} on ${machine}`);
          await showStatus();
          return;
        }
        if (options.silence !== undefined) {
          await silenceDemoNode(bus, options.silence);
          const { ttlSeconds } = (cfg as unknown as { presence?: { ttlSeconds?: number } }).presence ?? {};
          console.log(
            `${options.silence}: wrote its presence once and stopped; it is unreachable after ${Math.max(ttlSeconds ?? 60, 3 * PRESENCE_EVERY_SECONDS)} s with no write (mesh-provisioner nodes, status)`,
          );
          return;
        }
        if (options.catchUp) {
          const released = await catchUpDemo(bus);
          console.log(
            `${DEMO_ROTATION.machine}: wrote ${DEMO_ROTATION.consumer}'s applied record with ${DEMO_ROTATION.provision} at ${DEMO_ROTATION.revision}`,
          );
          console.log(
            `${DEMO_ROTATION.provider}: received mesh-provisioner.released.${DEMO_ROTATION.provider} ${JSON.stringify(released)}`,
          );
          console.log("\n$ rotations");
          console.log(formatRotations(await askAll(session.nc, { what: ROTATIONS }), new Date()));
          await failDemoCheck(bus);
          console.log(
            `\n${DEMO_ROTATION.machine}: ${DEMO_ROTATION.consumer} checked ${DEMO_ROTATION.provision} at ${DEMO_ROTATION.revision}, the newest: AuthFailed`,
          );
          console.log("\n$ checks --failing");
          console.log(formatChecks(await askChecks(session.nc, { ok: false }), new Date()));
          return;
        }
        const written = await writeDemo(cfg, bus);
        for (const [user, count] of Object.entries(written)) {
          console.log(
            cfg.embedded.controllers.includes(user)
              ? `${user}: wrote ${count} assignments as the controller`
              : `${user}: wrote ${count} records as node ${user}`,
          );
        }
        await publishDemoEvent(bus, "failing");
        console.log(`${provider}: published ${provider}.provisioner.failing for ${consumer} on ${machine}`);
        for (const request of DEMO_REQUESTS) {
          console.log(`\n$ ask ${JSON.stringify(request)}`);
          console.log(formatAnswer(await askAll(session.nc, request)));
        }
        await publishDemoRotation(bus);
        const { provider: rotator, provision, revision, machine: at, consumer: holder } = DEMO_ROTATION;
        console.log(`\n${rotator}: published ${rotator}.provisioner.rotated: ${provision} at ${revision} for ${holder} on ${at}`);
        console.log(`\n$ holders ${provision}`);
        console.log(formatHolders(await askAll(session.nc, { what: HOLDERS, provision }), new Date()));
        await showStatus();
        console.log(
          `\n(mesh-provisioner demo --recover publishes ${provider}'s recovery; --catch-up catches ${holder} on ${at} up, then its check fails; --silence <node> has a node stop reporting)`,
        );
      } finally {
        await session.close();
      }
    });
};
