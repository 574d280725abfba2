#!/usr/bin/env node
// Runs the TypeScript CLI with tsx, so `npx mesh-provisioner` needs no build step.
import { register } from "tsx/esm/api";

register();
await import("../cli/main.ts");
