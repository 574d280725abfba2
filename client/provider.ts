/**
 * A provider's client (docs/client.md §9.2): it publishes its failing, recovered and rotated
 * events through JetStream, hears when a rotation is released, and asks who holds a provision.
 */
import type { NatsConnection } from "nats";
import pRetry, { AbortError } from "p-retry";
import * as z from "zod/mini";
import {
  failingEvent,
  MAX_WORD,
  recoveredEvent,
  releasedNotice,
  releasedSubject,
  rotatedEvent,
  type ReleasedNotice,
} from "../contract/events.ts";
import { provisionName, token } from "../contract/keys.ts";
import { cutText } from "../contract/text.ts";
import { allPages, asOperations, checked, ClientArgumentError, listen, openMesh, tokenArg, type MeshOptions } from "./mesh.ts";

/** A provider client's options: the mesh, and the provider (the module) it publishes as. The user defaults to the provider's name. */
export interface ProviderOptions extends Omit<MeshOptions, "credentials"> {
  readonly provider: string;
  readonly credentials: { readonly user?: string; readonly password: string };
  /** How many times a publish is tried while JetStream does not answer (a leader being elected, the server away), 5 unless given. */
  readonly attempts?: number;
}

export type { ReleasedNotice } from "../contract/events.ts";

/** What a provider client does. Every method checks its arguments before anything is sent and throws a `ClientArgumentError` naming the first bad one. */
export interface ProviderClient {
  readonly provider: string;
  readonly nc: NatsConnection;
  /** Publishes `<provider>.provisioner.failing` `{ machine, consumer, word, at }` (docs/failing.md §5), `at` now. Resolves with the stream's sequence once stored. */
  failing(machine: string, consumer: string, word: string): Promise<number>;
  /** Publishes `<provider>.provisioner.recovered` `{ machine, consumer, at }`. Resolves with the stream's sequence once stored. */
  recovered(machine: string, consumer: string): Promise<number>;
  /**
   * Publishes `<provider>.provisioner.rotated` `{ provision, revision, at }`
   * (docs/rotation.md §8.2), with `machine` and `consumer` when only that holder's credential
   * changed. Resolves with the stream's sequence once stored.
   */
  rotated(provision: string, revision: string, holder?: { readonly machine?: string; readonly consumer?: string }): Promise<number>;
  /**
   * Calls `handler` once with each release of this provider's rotations (docs/rotation.md §8.6)
   * until stopped, then acknowledges it (`<provider>.provisioner.acknowledged`), so it is
   * published no more: those on `mesh-provisioner.released.<provider>`, and, at once and after
   * each reconnect, those released while this client was away and not acknowledged yet (asked
   * with `what=rotations`). A handler that throws is not acknowledged: the release comes again.
   * One out of shape is skipped.
   */
  onReleased(handler: (released: ReleasedNotice) => void | Promise<void>): { stop(): void };
  /** Every holder of `provision` across the mesh (docs/rotation.md §8.1), every page. */
  holders(provision: string): Promise<unknown[]>;
  /**
   * Waits for the calls under way (a `rotated`, a `failing`, …) to end as they would have, then
   * drains the connection. A call made after it rejects with a `ClientClosed`, nothing sent.
   * Called again, resolves when the first call does.
   */
  close(): Promise<void>;
}

/** A kept rotation as `what=rotations` answers it: the fields a release is made of, and whether it was released and acknowledged. */
const releasedRotation = z.extend(releasedNotice, {
  releasedAt: z.nullable(z.string()),
  releases: z.optional(z.number()),
  acknowledgedAt: z.optional(z.nullable(z.string())),
});

/** A rotation's holder: its machine and consumer, nothing else (docs/rotation.md §8.2). */
const rotatedHolder = z.strictObject({ machine: z.optional(token), consumer: z.optional(token) });

/**
 * Connects as provider `options.provider` (docs/client.md §9.2). Throws a `ClientArgumentError`
 * on bad options, and nats.js's error when the server refuses.
 */
export async function connectProvider(options: ProviderOptions): Promise<ProviderClient> {
  if (options === null || typeof options !== "object") throw new ClientArgumentError("options", "must be an object");
  const provider = tokenArg("provider", options.provider);
  const attempts = checked("attempts", z.int().check(z.minimum(1), z.maximum(100)), options.attempts ?? 5);
  const mesh = await openMesh({
    ...options,
    credentials: { user: options.credentials?.user ?? provider, password: options.credentials?.password } as never,
  });
  const js = mesh.nc.jetstream();

  /** Publishes one event, waiting for the stream's acknowledgement; tried again while JetStream does not answer. */
  const publish = (kind: string, event: unknown) =>
    pRetry(
      async () => {
        try {
          return (await js.publish(`${provider}.provisioner.${kind}`, JSON.stringify(event), { timeout: 5000 })).seq;
        } catch (err) {
          const code = (err as { code?: string }).code;
          // No responders (503) or no answer: the stream's leader is being elected, or the server is away.
          if (code === "503" || code === "TIMEOUT") throw err;
          throw new AbortError(err as Error);
        }
      },
      { retries: attempts - 1, minTimeout: 200, maxTimeout: 3000 },
    );

  const client: ProviderClient = {
    provider,
    nc: mesh.nc,
    // async: a bad argument rejects the promise, as every other method's does.
    failing: async (machine, consumer, word) => {
      const event = checked("", failingEvent, { machine, consumer, word, at: new Date().toISOString() });
      // Cut as the follower keeps it (docs/failing.md §5): a longer word would not fit one message.
      return publish("failing", { ...event, word: cutText(event.word, MAX_WORD) });
    },
    recovered: async (machine, consumer) =>
      publish("recovered", checked("", recoveredEvent, { machine, consumer, at: new Date().toISOString() })),
    async rotated(provision, revision, holder = {}) {
      if (typeof revision !== "string") throw new ClientArgumentError("revision", "must be a string");
      // Only a holder's own fields: a misspelt one must not widen the rotation to every holder.
      const { machine, consumer } = checked("holder", rotatedHolder, holder);
      const event = {
        provision,
        revision,
        at: new Date().toISOString(),
        ...(machine === undefined ? {} : { machine }),
        ...(consumer === undefined ? {} : { consumer }),
      };
      return publish("rotated", checked("", rotatedEvent, event));
    },
    onReleased(handler) {
      if (typeof handler !== "function") throw new ClientArgumentError("handler", "must be a function");
      mesh.ensureOpen("onReleased");
      // By rotation and revision: "handling" while the handler runs, "done" once it returned.
      const seen = new Map<string, "handling" | "done">();
      const acknowledge = (r: ReleasedNotice) => {
        const holder = r.machine === undefined ? {} : { machine: r.machine, consumer: r.consumer };
        return publish("acknowledged", { provision: r.provision, revision: r.revision, at: new Date().toISOString(), ...holder });
      };
      const deliver = async (r: ReleasedNotice) => {
        // A rotation, by its time too: a revision that comes back later (A, B, A) is another release.
        const id = JSON.stringify([r.provision, r.machine ?? null, r.consumer ?? null, r.revision, r.at]);
        const was = seen.get(id);
        if (was === "handling") return;
        // Handled already, and published again: the acknowledgement was lost or not followed yet.
        if (was === "done") return void (await acknowledge(r).catch(() => {}));
        seen.set(id, "handling");
        try {
          await handler(r);
        } catch {
          seen.delete(id);
          return;
        }
        seen.set(id, "done");
        await acknowledge(r).catch(() => {});
      };
      let stopped = false;
      /** The releases published while this client was away, not acknowledged yet: asked of the set. */
      const missed = async () => {
        const { entries } = await allPages<unknown>(mesh, { what: "rotations", provider });
        for (const entry of entries) {
          const r = releasedRotation.safeParse(entry);
          if (stopped || !r.success || r.data.releasedAt === null || r.data.acknowledgedAt !== null || r.data.releases === 0) continue;
          const { releasedAt: _r, releases: _n, acknowledgedAt: _a, ...notice } = r.data;
          await deliver(notice);
        }
      };
      const listening = listen(mesh.nc, releasedSubject(provider), releasedNotice, deliver);
      void missed().catch(() => {});
      void (async () => {
        for await (const s of mesh.nc.status()) {
          if (stopped) break;
          if (s.type === "reconnect") void missed().catch(() => {});
        }
      })();
      return {
        stop: () => {
          stopped = true;
          listening.stop();
        },
      };
    },
    async holders(provision) {
      return (await allPages(mesh, { what: "holders", provision: checked("provision", provisionName, provision) })).entries;
    },
    close: () => mesh.close(),
  };
  return asOperations(mesh, client, ["failing", "recovered", "rotated", "holders"]);
}
