// Starts a real `colibri serve` (embedded default model, fresh state, an API key) and a
// headless Debian Chromium driven by playwright-core. No browser download: CHROMIUM names
// the executable (default /usr/bin/chromium).
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const here = dirname(fileURLToPath(import.meta.url));
export const WEB = resolve(here, "..");
export const REPO = resolve(WEB, "..");
export const ARTIFACTS = process.env.WEB_ARTIFACTS ?? join(WEB, "test-artifacts");
export const CHROMIUM_FLAGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];

/** The environment of a fresh install: no model, atlas or key chosen outside the command. */
function freshEnv(state) {
  const env = { ...process.env, XDG_STATE_HOME: state, COLI_API_KEY: "" };
  for (const name of ["COLI_MODEL", "COLI_MODEL_ID", "COLIBRI_DEFAULT_MODEL", "COLI_ATLAS"]) delete env[name];
  return env;
}

/** `model`: a fixture model's name, or null for what a fresh install serves (no --model). */
export async function startServer({ apiKey, timeoutMs = 90_000, model = "glm5-chat-tiny" } = {}) {
  const bin = process.env.COLIBRI_BIN ?? join(REPO, ".venv", "bin", "colibri");
  const state = mkdtempSync(join(tmpdir(), "colibri-web-e2e-state-"));
  // glm5-chat-tiny by default, not the trained default: its random weights never emit EOS
  // early, so a greedy reply runs to the token limit and the Stop test has a long stream to cut.
  const args = ["serve", "--port", "0"];
  if (model) args.push("--model", join(REPO, "fixtures", "models", model));
  if (apiKey) args.push("--api-key", apiKey);
  // A fresh state root: persisted expert usage would make the first Brain map non-zero.
  const child = spawn(bin, args, {
    env: freshEnv(state),
    stdio: ["ignore", "pipe", "pipe"],
  });
  let log = "";
  child.stderr.on("data", (d) => (log += d.toString()));
  const url = await new Promise((ok, fail) => {
    const timer = setTimeout(() => fail(new Error(`colibri serve did not get ready in ${timeoutMs} ms:\n${log}`)), timeoutMs);
    let out = "";
    child.stdout.on("data", (d) => {
      out += d.toString();
      const m = /colibri serving \S+ on (http:\/\/\S+)\/v1/.exec(out);
      if (m) {
        clearTimeout(timer);
        ok(m[1]);
      }
    });
    child.on("exit", (code) => {
      clearTimeout(timer);
      fail(new Error(`colibri serve exited with ${code} before it was ready:\n${log}`));
    });
    child.on("error", (e) => {
      clearTimeout(timer);
      fail(new Error(`cannot start ${bin}: ${e.message}`));
    });
  });
  return {
    url,
    log: () => log,
    async stop() {
      if (child.exitCode === null) {
        const gone = new Promise((r) => child.once("exit", r));
        child.kill("SIGTERM");
        const t = setTimeout(() => child.kill("SIGKILL"), 15_000);
        await gone;
        clearTimeout(t);
      }
      rmSync(state, { recursive: true, force: true });
    },
  };
}

export async function launchBrowser() {
  const profile = mkdtempSync(join(tmpdir(), "colibri-web-e2e-chromium-"));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
    headless: true,
    args: CHROMIUM_FLAGS,
    viewport: { width: 1280, height: 800 },
    acceptDownloads: true,
  });
  return {
    context,
    async close() {
      await context.close();
      rmSync(profile, { recursive: true, force: true });
    },
  };
}

export const AXE_SOURCE = () => readFileSync(join(WEB, "node_modules", "axe-core", "axe.min.js"), "utf8");

/** Run axe on the page; returns the serious and critical violations. */
export async function axeSerious(page) {
  if (!(await page.evaluate(() => "axe" in window))) await page.addScriptTag({ content: AXE_SOURCE() });
  const result = await page.evaluate(async () => {
    // eslint-disable-next-line no-undef
    const r = await axe.run(document, { resultTypes: ["violations"] });
    return r.violations.map((v) => ({ id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.map((n) => n.target.join(" ")).slice(0, 5) }));
  });
  return result.filter((v) => v.impact === "serious" || v.impact === "critical");
}
