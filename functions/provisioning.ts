import { defineFunction } from "../runtime/index.ts";
import {
  answerPage,
  answerSchema,
  answerItemsPage,
  answerStatePage,
  answerHistoryPage,
  cursorsOf,
  HISTORY,
  historyBefore,
  HOLDERS,
  ROTATIONS,
  provisioningRequest,
  requestFilters,
  STATE,
  VERB,
  WHATS,
  type BucketRequest,
} from "./_lib/provisioning.ts";
import { appliedIndex } from "./_lib/applied.ts";
import { heldIn, holdersIndex } from "./_lib/holders.ts";
import { isStale, newestFor, rotationsIn, rotationStates } from "./_lib/rotation.ts";
import { provisioningConfig, readModel, STATE_VIEWS } from "./_lib/state.ts";
import { historyOf } from "./_lib/history.ts";
import { EVENTS_STREAM } from "./_lib/follower.ts";

/**
 * The verb of docs/verb.md §4: read-only views of the registry and of what node clients
 * recorded, the module states of docs/state.md §7, the holders and rotations of docs/rotation.md §8,
 * and the events' history of docs/failing.md §5.8.
 */
export default defineFunction({
  description:
    "Answers mesh-provisioner.provisioning: the registry, needs, applied and collect, and each module's state, narrowed and paged.",
  triggers: [{ subject: VERB }, { http: "GET /provisioning" }],
  input: provisioningRequest,
  output: answerSchema,
  config: provisioningConfig,
  // The buckets the verb answers and those the state reads, each once.
  access: { views: [...new Set([...WHATS, ...STATE_VIEWS])], streams: [EVENTS_STREAM] },
  handler: async (request, ctx) => {
    const cursors = cursorsOf(request);
    if (request.what === HISTORY) {
      const { provider, machine, consumer, since } = request;
      const items = await historyOf(
        ctx.streams[EVENTS_STREAM]!,
        { provider, machine, consumer },
        { before: historyBefore(cursors), since: since === undefined ? undefined : new Date(since), count: request.limit + 1 },
      );
      return answerHistoryPage(request, items, ctx.limits.maxPayload, cursors);
    }
    if (request.what === STATE) {
      const { graceSeconds } = ctx.config.provisioning;
      const { model, confirmedAt } = await readModel(ctx, { stale: request.stale });
      return answerStatePage(request, model, ctx.clock.now(), graceSeconds, ctx.limits.maxPayload, cursors, confirmedAt);
    }
    if (request.what === HOLDERS || request.what === ROTATIONS) {
      const [needs, applied, rotationsSnapshot] = await Promise.all([
        ctx.views.needs.snapshot(),
        ctx.views.applied.snapshot(),
        ctx.views.rotations.snapshot(),
      ]);
      const [byProvision, appliedByKey, { rotations, outOfShape }] = await Promise.all([
        holdersIndex(needs),
        appliedIndex(applied),
        rotationsIn(rotationsSnapshot.reads),
      ]);
      const heldBy = heldIn(appliedByKey);
      if (request.what === HOLDERS) {
        const provision = request.provision!;
        const ofProvision = rotations.filter((r) => r.provision === provision);
        const items = (byProvision.get(provision) ?? [])
          .filter((h) => (request.node === undefined || h.node === request.node) && (request.kind === undefined || h.kind === request.kind))
          .map((h) => {
            const holding = heldBy(h, provision);
            const newest = newestFor(ofProvision, h);
            const entry = {
              ...h,
              revision: holding.revision,
              appliedAt: holding.appliedAt?.toISOString() ?? null,
              stale: newest !== undefined && isStale(newest, holding),
            };
            return { key: h.key, text: JSON.stringify(entry) };
          });
        return answerItemsPage(HOLDERS, request, items, ctx.limits.maxPayload, cursors);
      }
      const { states } = rotationStates(rotations, byProvision, heldBy);
      const items = states
        .filter(
          (r) =>
            (request.provider === undefined || r.provider === request.provider) &&
            (request.provision === undefined || r.provision === request.provision),
        )
        .map((r) => ({ key: r.key, text: JSON.stringify(r) }));
      return answerItemsPage(ROTATIONS, request, items, ctx.limits.maxPayload, cursors, outOfShape);
    }
    const asked = request as BucketRequest;
    // One more than the page holds, to know whether keys remain.
    const view = ctx.views[asked.what];
    // `stale`: what the view holds now, without asking the server, and since when it is known
    // current (read first: a confirmation after the read would claim more than it holds).
    const confirmedAt = request.stale ? view.confirmedAt() : undefined;
    const reached = await (request.stale ? view.local : view).list(requestFilters(asked), {
      after: cursors.after,
      limit: request.limit + 1,
    });
    return answerPage(asked, reached, ctx.limits.maxPayload, cursors, confirmedAt);
  },
});
