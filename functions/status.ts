import { defineFunction } from "../runtime/index.ts";
import { countFailing, readStatus, STATUS, statusAnswer, statusRequest } from "./_lib/status.ts";

/** docs/failing.md §5: whether the mesh is well, naming every failing provider until it recovers. */
export default defineFunction({
  description: "Answers mesh-provisioner.status: what fails (provider, machine, consumer, word, since), the registry, refused events.",
  triggers: [{ subject: STATUS }, { http: "GET /status" }],
  input: statusRequest,
  output: statusAnswer,
  access: { views: ["failing", "registry"] },
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
  },
  handler: (request, ctx) => readStatus(request, ctx.views, ctx.runtime, ctx.limits.maxPayload),
});
