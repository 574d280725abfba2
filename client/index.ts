/**
 * The client library of the mesh (docs/client.md §9): how a node's provisioner client and a
 * provider use mesh-provisioner, with the key shapes, the need-name rule, the inbox prefix and
 * the bucket handles the permissions require done here, so a caller never does them by hand.
 *
 *     import { connectNode, connectProvider } from "mesh-provisioner/client";
 */
export {
  connectNode,
  type BackgroundFailure,
  type CheckResult,
  type NodeClient,
  type NodeOptions,
  type Placeholders,
  type RefreshNotice,
} from "./node.ts";
export { connectProvider, type ProviderClient, type ProviderOptions, type ReleasedNotice } from "./provider.ts";
export {
  ClientArgumentError,
  ClientClosed,
  collectKey,
  MeshRefusal,
  MeshUnanswered,
  needKey,
  needOf,
  usersFile,
  type Credentials,
  type MeshOptions,
} from "./mesh.ts";
