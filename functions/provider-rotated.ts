import { badInput, defineFunction } from "../runtime/index.ts";
import { EVENTS_STREAM, notAhead } from "./_lib/follower.ts";
import { keepRotation, providerOfSubject, rotatedEvent } from "./_lib/rotation.ts";

/** docs/rotation.md §8.2: a provider rotated a credential; the newest rotation per provider, provision (and holder) is kept. */
export default defineFunction({
  description:
    "Follows <provider>.provisioner.rotated: keeps the newest rotation per provider, provision and, when named, machine and consumer.",
  triggers: [{ event: "*.provisioner.rotated", stream: EVENTS_STREAM }],
  input: rotatedEvent,
  access: { writes: ["rotations"] },
  handler: async (event, ctx) => {
    if (ctx.trigger.kind !== "event" || ctx.trigger.storedAt === undefined) throw badInput("a rotation comes from the events stream");
    const provider = providerOfSubject(ctx.trigger.subject);
    notAhead(event.at, ctx.clock.now());
    const change = await keepRotation(ctx.buckets.rotations, provider, event, ctx.trigger.storedAt);
    ctx.log.debug({ provider, provision: event.provision, revision: event.revision, change }, "rotated");
    return { change };
  },
});
