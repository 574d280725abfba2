import { defineFunction, WithStatus } from "../runtime/index.ts";
import {
  CONDITIONS,
  conditionsAt,
  failingChecksOf,
  NO_PROVISIONING,
  nodesStatusOf,
  notWellCount,
  PRESENCES,
  provisioningConfig,
  provisioningOf,
  readModel,
  staleHoldersOf,
  STATE_VIEWS,
  STATES,
  unconfirmedChecksOf,
} from "./_lib/state.ts";
import { countFailing, NO_NODES, readStatus, STATUS, statusAnswer, statusReads, statusRequest } from "./_lib/status.ts";

/**
 * docs/failing.md §5: whether the mesh is well, naming every failing provider until it recovers
 * and every module not well (docs/state.md §7). Over HTTP the answer is a 200 when well and a
 * 503 when not, so a probe reads it from the status code (docs/failing.md §5.6).
 */
export default defineFunction({
  description:
    "Answers mesh-provisioner.status: what fails (provider, machine, consumer, word, since), the modules not well, the registry, refused events.",
  triggers: [{ subject: STATUS }, { http: "GET /status" }],
  input: statusRequest,
  output: statusAnswer,
  config: provisioningConfig,
  access: { views: STATE_VIEWS },
  metrics: {
    failing_triples: {
      type: "gauge",
      help: "Failing triples (provider, machine, consumer) in the failing bucket",
      collect: async (ctx) => (await countFailing(ctx.views.failing.local)).failing,
    },
    failing_keys_out_of_shape: {
      type: "gauge",
      help: "Keys of the failing bucket out of shape (status is not well while there are any)",
      collect: async (ctx) => (await countFailing(ctx.views.failing.local)).outOfShape,
    },
    modules_by_state: {
      type: "gauge",
      help: "Modules of every node by provisioning state (docs/state.md §7)",
      labels: ["state"],
      collect: async (ctx) => {
        const { model } = await readModel(ctx, { stale: true });
        return STATES.map((state) => ({ labels: { state }, value: model.counts[state] }));
      },
    },
    modules_not_well: {
      type: "gauge",
      help: "Modules that count against the mesh now (docs/state.md §7.6): status is not well while there are any",
      collect: async (ctx) => {
        const { model } = await readModel(ctx, { stale: true });
        return notWellCount(model, ctx.clock.now());
      },
    },
    stale_holders: {
      type: "gauge",
      help: "Holders of a rotated provision not on its new revision yet (docs/rotation.md §8.3), within their grace or past it",
      collect: async (ctx) => (await readModel(ctx, { stale: true })).model.staleHolders,
    },
    nodes_by_presence: {
      type: "gauge",
      help: "Nodes by presence: reachable, unreachable, silent (docs/presence.md §16.3)",
      labels: ["presence"],
      collect: async (ctx) => {
        const { model } = await readModel(ctx, { stale: true });
        const { counts } = nodesStatusOf(model, ctx.clock.now());
        return PRESENCES.map((presence) => ({ labels: { presence }, value: counts[presence] }));
      },
    },
    checks: {
      type: "gauge",
      help: "Kept checks by result: ok, failing, unconfirmed (their node not reachable; counted in ok or failing too) (docs/presence.md §16.5)",
      labels: ["result"],
      collect: async (ctx) => {
        const { model } = await readModel(ctx, { stale: true });
        return [
          { labels: { result: "ok" }, value: model.checks.ok },
          { labels: { result: "failing" }, value: model.checks.failing },
          { labels: { result: "unconfirmed" }, value: unconfirmedChecksOf(model, ctx.clock.now()) },
        ];
      },
    },
    module_conditions: {
      type: "gauge",
      help: "Modules carrying each condition (docs/state.md §7), Late included",
      labels: ["type"],
      collect: async (ctx) => {
        const { model } = await readModel(ctx, { stale: true });
        const counted = conditionsAt(model, ctx.clock.now());
        return CONDITIONS.map((type) => ({ labels: { type }, value: counted[type] }));
      },
    },
  },
  handler: async (request, ctx) => {
    const { graceSeconds } = ctx.config.provisioning;
    const { inputs, model, runtime } = await statusReads(ctx);
    // A narrowing by provider speaks of providers only; by machine and consumer, of that node's and module's provisioning too.
    const provisioning =
      request.provider === undefined
        ? provisioningOf(model, ctx.clock.now(), graceSeconds, { node: request.machine, module: request.consumer })
        : NO_PROVISIONING;
    const stale = staleHoldersOf(model, ctx.clock.now(), { provider: request.provider, node: request.machine, module: request.consumer });
    // Narrowed by provider, or by consumer alone, of no node (a consumer's node said by its Unconfirmed); by machine, of that node.
    const nodes =
      request.provider === undefined && (request.machine !== undefined || request.consumer === undefined)
        ? nodesStatusOf(model, ctx.clock.now(), { node: request.machine })
        : NO_NODES;
    const status = await readStatus(
      request,
      { failing: inputs.failing.reads, registry: inputs.registry.reads },
      runtime,
      ctx.limits.maxPayload,
      {
        provisioning,
        stale,
        nodes,
        checks: {
          failing: request.provider === undefined ? failingChecksOf(model, { node: request.machine, module: request.consumer }) : 0,
        },
      },
    );
    return new WithStatus(status.well ? 200 : 503, status);
  },
});
