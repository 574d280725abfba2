import { defineFunction } from "../runtime/index.ts";
import { readStatus, STATUS, statusAnswer, statusRequest } from "./_lib/failing.ts";

/** SPEC §5: whether the mesh is well, naming every failing provider until it recovers. */
export default defineFunction({
  description: "Answers mesh-provisioner.status: what fails (provider, machine, consumer, word, since), the registry, refused events.",
  triggers: [{ subject: STATUS }, { http: "GET /status" }],
  input: statusRequest,
  output: statusAnswer,
  access: { views: ["failing", "registry"] },
  handler: (request, ctx) => readStatus(request, ctx.views, ctx.runtime, ctx.limits.maxPayload),
});
