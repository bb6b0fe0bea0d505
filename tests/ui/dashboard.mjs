// Drives Debian's Chromium (headless) through a node's /ui for
// tests/tests/dashboard.rs. The Rust test owns the cluster and sends one
// command per line on stdin; each is answered on stdout with `ok …` or
// `fail …` (then the script exits 1):
//   sign-in              the page asks for a token; type it and submit; wait
//                        until the board shows
//   submit-token         the page asks for a token; type it and submit
//   refresh-failed       wait until the page says its last refresh failed
//   board                wait until the board shows
//   granted KEY N        wait until KEY's row shows N permits granted
//   holders KEY N        wait until KEY's row shows N clients holding
//   lag NODE             wait until NODE's row shows a replication lag
//   open KEY CLIENT      click KEY; wait until its holders list CLIENT
//   event TYPE KEY       wait until the event list shows a TYPE event of KEY
//   screenshot PATH      write a PNG of the whole page
//   quit                 fail on requests to other origins or script errors; exit
// Settings come from the environment: PERMITD_UI_URL, PERMITD_TOKEN,
// PERMITD_CHROMIUM (default /usr/bin/chromium).
import { createInterface } from "node:readline";
import { chromium } from "playwright-core";

// Generous: the machine running CI may be shared and slow.
const WAIT_MS = 30_000;
const url = new URL(process.env.PERMITD_UI_URL);
const browser = await chromium.launch({
  executablePath: process.env.PERMITD_CHROMIUM || "/usr/bin/chromium",
  args: [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
  ],
});
const page = await browser.newPage({ viewport: { width: 1366, height: 768 } });
const foreign = [];
page.on("request", (request) => {
  if (new URL(request.url()).origin !== url.origin) foreign.push(request.url());
});
// Uncaught script errors (a refused call's console line is expected: the page
// asks without a token first).
const scriptErrors = [];
page.on("pageerror", (error) => scriptErrors.push(error.message));
await page.goto(url.href);

const row = (key) => `tr[data-key="${key}"]`;

async function waitForText(selector, expected) {
  await page.waitForFunction(
    ([selector, expected]) => document.querySelector(selector)?.textContent.trim() === expected,
    [selector, expected],
    { timeout: WAIT_MS },
  );
}

const commands = {
  async "sign-in"() {
    await commands["submit-token"]();
    await commands.board();
  },
  async "submit-token"() {
    await page.waitForSelector("#token-input", { state: "visible", timeout: WAIT_MS });
    await page.fill("#token-input", process.env.PERMITD_TOKEN);
    await page.click("#token-form button[type=submit]");
  },
  async "refresh-failed"() {
    await page.waitForFunction(
      () => document.querySelector("#refreshed")?.textContent.startsWith("last refresh failed"),
      null,
      { timeout: WAIT_MS },
    );
  },
  async board() {
    await page.waitForSelector("#board", { state: "visible", timeout: WAIT_MS });
  },
  async granted(key, count) {
    await waitForText(`${row(key)} td.granted`, count);
  },
  async lag(node) {
    await page.waitForFunction(
      (node) => /^\d+ entries$/.test(document.querySelector(`tr[data-node="${node}"] td.lag`)?.textContent ?? ""),
      node,
      { timeout: WAIT_MS },
    );
  },
  async "shard-leader"(shard, node) {
    await waitForText(`#shards tr[data-shard="${shard}"] td.leader`, node);
  },
  async open(key, clientId) {
    await page.click(`${row(key)} td.key a`);
    await page.waitForFunction(
      (clientId) => [...document.querySelectorAll("#holders-table td.key")]
        .some((cell) => cell.textContent === clientId),
      clientId,
      { timeout: WAIT_MS },
    );
  },
  async holders(key, count) {
    await waitForText(`${row(key)} td.holders`, count);
  },
  async event(type, key) {
    await page.waitForFunction(
      ([type, key]) => [...document.querySelectorAll(`#event-list li[data-type="${type}"]`)]
        .some((item) => item.textContent.includes(` ${key} · `) || item.textContent.includes(`${key} · `)),
      [type, key],
      { timeout: WAIT_MS },
    );
  },
  async screenshot(path) {
    await page.screenshot({ path, fullPage: true });
  },
  async quit() {
    await browser.close();
    if (foreign.length) throw new Error(`requests to other origins: ${foreign.join(", ")}`);
    if (scriptErrors.length) throw new Error(`script errors: ${scriptErrors.join(" | ")}`);
    console.log("ok quit");
    process.exit(0);
  },
};

for await (const line of createInterface({ input: process.stdin })) {
  const [name, ...args] = line.trim().split(/\s+/);
  try {
    if (!commands[name]) throw new Error(`unknown command ${name}`);
    await commands[name](...args);
    console.log(`ok ${line}`);
  } catch (error) {
    // What the page showed, to tell a slow page from a wrong one.
    const shown = await page.evaluate(() => document.body.innerText.replace(/\s+/g, " ").slice(0, 1500))
      .catch(() => "(page unreadable)");
    console.log(`fail ${line}: ${error.message.split("\n")[0]} | page: ${shown}`);
    await browser.close().catch(() => {});
    process.exit(1);
  }
}
await browser.close();
