// Two builds of one page: `vite build --mode ai7` (the current AI SDK, `ai` and `@ai-sdk/react`)
// and `--mode ai6` (the npm aliases `ai-v6` and `@ai-sdk/react-v6`), each in dist/<mode>.
// No React plugin: esbuild compiles the JSX (npm 10 machines cannot install the plugin's Vite 8).
import { readFileSync } from "node:fs";
import { defineConfig } from "vite";

const SDKS = {
  ai7: { ai: "ai", react: "@ai-sdk/react" },
  ai6: { ai: "ai-v6", react: "@ai-sdk/react-v6" },
};

function sdkVersion(name) {
  const manifest = new URL(`./node_modules/${name}/package.json`, import.meta.url);
  return JSON.parse(readFileSync(manifest, "utf8")).version;
}

export default defineConfig(({ mode }) => {
  const build = mode in SDKS ? mode : "ai7";
  const sdk = SDKS[build];
  const alias =
    build === "ai7"
      ? []
      : [
          { find: /^ai$/, replacement: sdk.ai },
          { find: /^@ai-sdk\/react$/, replacement: sdk.react },
        ];
  return {
    base: "/chat/",
    esbuild: { jsx: "automatic" },
    define: { __AI_SDK_VERSION__: JSON.stringify(sdkVersion(sdk.ai)) },
    resolve: { alias },
    build: { outDir: `dist/${build}`, emptyOutDir: true },
    server: { proxy: { "/api": "http://127.0.0.1:5000" } },
  };
});
