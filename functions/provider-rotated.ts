import { defineFunction } from "../runtime/index.ts";
import { EVENTS_STREAM, notAhead, providerOf, storedOf } from "./_lib/follower.ts";
import { rotatedEvent } from "../contract/events.ts";
import { keepRotation } from "./_lib/rotation-record.ts";

/** docs/rotation.md §8.2: a provider rotated a credential; the newest rotation per provider, provision (and holder) is kept. */
export default defineFunction({
  description:
    "Follows <provider>.provisioner.rotated: keeps the newest rotation per provider, provision and, when named, machine and consumer.",
  triggers: [{ event: "*.provisioner.rotated", stream: EVENTS_STREAM }],
  input: rotatedEvent,
  access: { writes: ["rotations"] },
  handler: async (event, ctx) => {
    const provider = providerOf(ctx.trigger);
    const stored = storedOf(ctx.trigger);
    notAhead(event.at, stored.at);
    const change = await keepRotation(ctx.buckets.rotations, provider, event, stored.nanos);
    ctx.log.debug({ provider, provision: event.provision, revision: event.revision, change }, "rotated");
    return { change };
  },
});
