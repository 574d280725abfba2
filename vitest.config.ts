import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    testTimeout: 60_000,
    hookTimeout: 60_000,
    env: { LOG_LEVEL: "silent" },
    projects: [
      { extends: true, test: { name: "set", include: ["test/**/*.test.ts"], exclude: ["test/cluster.test.ts"] } },
      // Three servers with replicas 3 and two replicas of the set: run alone, once every other file is done,
      // so the cluster's timing is not the machine's load.
      { extends: true, test: { name: "cluster", include: ["test/cluster.test.ts"], sequence: { groupOrder: 1 } } },
    ],
  },
});
