import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    testTimeout: 60_000,
    hookTimeout: 60_000,
    env: { LOG_LEVEL: "silent" },
    projects: [
      { extends: true, test: { name: "set", include: ["test/**/*.test.ts"], exclude: ["test/cluster*.test.ts"] } },
      // Clusters of three servers (test/cluster*.test.ts) with replicas 3 and replicas of the set: run once every other file is
      // done, one file at a time, so a cluster's timing is not the machine's load.
      {
        extends: true,
        test: { name: "cluster", include: ["test/cluster*.test.ts"], fileParallelism: false, sequence: { groupOrder: 1 } },
      },
    ],
  },
});
