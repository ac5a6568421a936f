// Drives the example checkout page in headless Chromium, as the browser test does:
//
//   node examples/checkout/drive.mjs <page URL> <attempts> [--at-once]
//
// submits the page's form <attempts> times, each once the answer before it is shown
// (with --at-once: all of them at once, then waits for every answer), and prints one
// JSON line: every attempt as the page shows it, by number, the page's state line,
// and what the page logged (console messages and uncaught errors), for a failure's
// message. Chromium is Debian's (scripts/install-chromium.sh); playwright-core comes
// from the client's node_modules (`npm ci --prefix clients/typescript`).
import { mkdtempSync, rmSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";

const require = createRequire(new URL("../../clients/typescript/package.json", import.meta.url));
const { chromium } = require("playwright-core");

const [pageUrl, attemptsArg, mode] = process.argv.slice(2);
const attempts = Number(attemptsArg);
const atOnce = mode === "--at-once";
if (!pageUrl || !(attempts >= 1) || (mode !== undefined && !atOnce)) {
  console.error("usage: node drive.mjs <page URL> <attempts> [--at-once]");
  process.exit(64);
}

// Bounds: an answer waits at most 30 s server-side (Prefer: wait), so 60 s means stuck.
const ANSWER_TIMEOUT_MS = 60_000;
const WHOLE_RUN_TIMEOUT_MS = 150_000;
setTimeout(() => {
  console.error(`drive.mjs: gave up after ${WHOLE_RUN_TIMEOUT_MS} ms`);
  process.exit(70);
}, WHOLE_RUN_TIMEOUT_MS).unref();

const profile = mkdtempSync(join(tmpdir(), "tokenmint-chromium-"));
const logged = [];
let context;
try {
  context = await chromium.launchPersistentContext(profile, {
    executablePath: "/usr/bin/chromium",
    headless: true,
    timeout: 30_000,
    // Without the background-networking flags Chromium keeps calling out to its
    // services, which on a closed network is a flood of refused connections.
    args: [
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
  });
  const page = context.pages()[0] ?? (await context.newPage());
  page.on("console", (message) => logged.push(`console.${message.type()}: ${message.text()}`));
  page.on("pageerror", (error) => logged.push(`pageerror: ${error.message}`));
  await page.goto(pageUrl, { timeout: 30_000 });
  // Answered (`last` attempts shown) or failed without an answer (the state line says so).
  const answered = (last) =>
    page.waitForFunction(
      (n) =>
        document.querySelectorAll("[data-attempt]").length >= n ||
        document.querySelector("#state").textContent.includes("failed"),
      last,
      { timeout: ANSWER_TIMEOUT_MS },
    );
  for (let number = 1; number <= attempts; number++) {
    await page.click("#submit", { timeout: 10_000 });
    if (!atOnce) await answered(number);
  }
  if (atOnce) await answered(attempts);
  const shown = await page.$$eval("[data-attempt]", (sections) =>
    sections.map((section) => ({
      attempt: Number(section.dataset.attempt),
      fields: Object.fromEntries(
        [...section.querySelectorAll("[data-field]")].map((d) => [d.dataset.field, d.textContent]),
      ),
      tokens: [...section.querySelectorAll("[data-token-id]")].map((li) => li.dataset.tokenId),
    })),
  );
  shown.sort((a, b) => a.attempt - b.attempt);
  const state = await page.textContent("#state");
  console.log(JSON.stringify({ attempts: shown, state, logged }));
} catch (error) {
  console.error(`drive.mjs: ${error.stack ?? error}`);
  for (const line of logged) console.error(line);
  process.exitCode = 1;
} finally {
  await context?.close();
  rmSync(profile, { recursive: true, force: true });
}
