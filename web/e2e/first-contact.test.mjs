// A fresh install's dashboard, as a newcomer meets it: `colibri serve` with no model, no key
// and fresh state (the trained default model), real headless Chromium. The empty chat offers
// the prompts the model ships and one of them is answered right at the page's defaults;
// System One starts from a question the model answers right, with the probability the
// allowed answers hold; Explore shows the atlas the model ships; nothing is logged as an error.
import assert from "node:assert/strict";
import { mkdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { ARTIFACTS, REPO, axeSerious, launchBrowser, startServer } from "./harness.mjs";

const EXAMPLES = JSON.parse(readFileSync(join(REPO, "fixtures", "models", "glm5-chat-small", "examples.json"), "utf8"));

let server;
let browser;
let page;
const consoleErrors = [];
const pageErrors = [];

async function goto(name) {
  await page.click(`[data-page=${name}]`);
  await page.waitForSelector(`[data-page=${name}][aria-current=page]`);
}

before(async () => {
  mkdirSync(ARTIFACTS, { recursive: true });
  server = await startServer({ model: null });
  browser = await launchBrowser();
  page = browser.context.pages()[0] ?? (await browser.context.newPage());
  page.setDefaultTimeout(30_000);
  // Every console error counts here, failed requests included: a fresh install has none.
  page.on("console", (m) => {
    if (m.type() === "error") consoleErrors.push(`${m.text()} @ ${m.location()?.url ?? ""}`);
  });
  page.on("pageerror", (e) => pageErrors.push(e.message));
});

after(async () => {
  await browser?.close();
  await server?.stop();
});

describe("a fresh install's dashboard", () => {
  it("the empty chat offers the model's example prompts, and one is answered right", async () => {
    await page.goto(server.url + "/");
    await page.waitForSelector("[data-testid=conn-state][data-state=connected]");
    await page.waitForSelector("[data-testid=example-prompt]");
    const offered = await page.locator("[data-testid=example-prompt]").allTextContents();
    assert.deepEqual(offered, EXAMPLES.chat.map((e) => e.prompt));
    await page.screenshot({ path: join(ARTIFACTS, "first-contact-chat-desktop.png") });
    assert.deepEqual(await axeSerious(page), [], "axe on the empty chat with its examples");
    // The page's own defaults (temperature 0.7, reasoning on): nothing is changed first.
    await page.locator("[data-testid=example-prompt]").first().click();
    await page.waitForSelector("[data-testid=stop]");
    await page.waitForSelector("[data-testid=send]", { timeout: 60_000 });
    const user = await page.locator("article.msg-user .msg-content").first().textContent();
    assert.equal(user, EXAMPLES.chat[0].prompt);
    const reply = await page.locator("article.msg-assistant .msg-content").last().textContent();
    assert.ok(reply.includes(EXAMPLES.chat[0].answer), reply);
    assert.equal(await page.$("[data-testid=examples]"), null, "the examples go once the chat has begun");
  });

  it("System One starts from the model's example and answers it right, with most of the probability", async () => {
    await goto("systemone");
    const s1 = EXAMPLES.systemone;
    await page.waitForFunction((q) => document.querySelector("#s1-q")?.value === q, s1.question);
    assert.equal(await page.inputValue("#s1-doc"), s1.state);
    assert.equal(await page.inputValue("#s1-opts"), s1.options.join("\n"));
    await page.click("[data-testid=s1-ask]");
    await page.waitForSelector("[data-testid=s1-result]");
    assert.equal(await page.textContent("[data-testid=s1-result] .answer"), s1.answer);
    const covered = page.locator("[data-testid=s1-covered]");
    assert.equal(await covered.getAttribute("data-out-of-depth"), "false");
    assert.match(await covered.textContent(), /The allowed answers hold \d+(\.\d+)? % of the model's probability \(the page warns under 50 %\)/);
    await page.screenshot({ path: join(ARTIFACTS, "first-contact-systemone-desktop.png") });
  });

  it("Explore shows the atlas the model ships and names the commands that make one", async () => {
    await goto("brain");
    await page.click("[data-testid=tab-explore]");
    await page.waitForSelector("[data-testid=atlas]");
    const analysis = JSON.parse(readFileSync(join(REPO, "fixtures", "models", "glm5-chat-small", "atlas_analysis.json"), "utf8"));
    assert.match(await page.textContent("[data-testid=atlas]"), new RegExp(`${analysis.experts.length} characterised experts, \\d+ specialists, ${analysis.categories.length} topics`));
    const command = await page.textContent("[data-testid=atlas-command]");
    assert.ok(command.includes("colibri atlas sweep --model DIR --out atlas") && command.includes("colibri atlas analyze --stats atlas/stats --web"), command);
    await page.screenshot({ path: join(ARTIFACTS, "first-contact-explore-desktop.png") });
    await page.click("#tab-live");
  });

  it("logs no console error and no uncaught page error", () => {
    assert.deepEqual(pageErrors, []);
    assert.deepEqual(consoleErrors, []);
  });
});
