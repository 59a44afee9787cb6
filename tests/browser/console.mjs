// Drives the idemgate console in Debian's chromium through playwright-core
// (never a downloaded browser). Started by tests/console.rs, which owns the
// servers: this script asks it for counts on stdout ("ask <question>") and
// reads the answer from stdin. It exits non-zero on the first broken
// expectation, and on any console error or CSP violation in the page.
//
// Environment: GATEWAY_URL, GATEWAY_ADMIN_URL, RELAY_ADMIN_URL,
// ADMIN_TOKEN, SHOTS_DIR (screenshots), CHROMIUM (the browser binary).

import { createInterface } from "node:readline";
import { join } from "node:path";
import { chromium } from "playwright-core";

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};
const GATEWAY = env("GATEWAY_URL");
const ADMIN = env("GATEWAY_ADMIN_URL");
const RELAY_ADMIN = env("RELAY_ADMIN_URL");
const TOKEN = env("ADMIN_TOKEN");
const SHOTS = env("SHOTS_DIR");

const answers = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
async function ask(question) {
  process.stdout.write(`ask ${question}\n`);
  const { value, done } = await answers.next();
  if (done) throw new Error(`no answer to ${question}`);
  return value;
}

function expect(condition, what) {
  if (!condition) throw new Error(`expected ${what}`);
}

const WIDTHS = { desktop: { width: 1280, height: 860 }, phone: { width: 375, height: 760 } };

const browser = await chromium.launch({
  executablePath: env("CHROMIUM"),
  headless: true,
  args: ["--no-sandbox", "--disable-background-networking"],
});
const problems = [];
const desktop = await browser.newContext({ viewport: WIDTHS.desktop });
const page = await desktop.newPage();
// A refused API call is logged by the browser as "Failed to load resource": expected here
// (the wrong token, a relay's 404). Anything else, a CSP refusal above all, is a problem.
const watch = (target, label) => {
  target.on("console", (message) => {
    if (message.type() === "error" && !message.text().startsWith("Failed to load resource")) {
      problems.push(`${label} console: ${message.text()}`);
    }
  });
  target.on("pageerror", (error) => problems.push(`${label} page error: ${error.message}`));
};
watch(page, "gateway");
page.setDefaultTimeout(15_000);

/** The same page state at phone width too, in a context of its own with the same session storage. */
async function shoot(name, target = page) {
  await target.screenshot({ path: join(SHOTS, `${name}-desktop.png`), fullPage: true });
  await target.setViewportSize(WIDTHS.phone);
  await target.screenshot({ path: join(SHOTS, `${name}-phone.png`), fullPage: true });
  const width = await target.evaluate(() => document.documentElement.scrollWidth);
  expect(width <= WIDTHS.phone.width, `${name} to fit 375 px without sideways scrolling (is ${width} px)`);
  await target.setViewportSize(WIDTHS.desktop);
}

async function request(key, tenant) {
  const response = await fetch(`${GATEWAY}/charge`, {
    method: "POST",
    headers: { "Idempotency-Key": key, Authorization: tenant, "Content-Type": "application/json" },
    body: "{}",
  });
  return { status: response.status, replayed: response.headers.get("idempotent-replayed") === "true" };
}

async function refreshUntil(what, check) {
  const deadline = Date.now() + 20_000;
  for (;;) {
    await page.click("#refresh");
    await page.waitForTimeout(200);
    if (await check()) return;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
  }
}

try {
  // The files need no token, and carry the policy.
  const served = await fetch(`${ADMIN}/admin/ui/`);
  expect(served.headers.get("content-security-policy")?.includes("default-src 'none'"), "the CSP header on the page");
  const redirect = await fetch(`${ADMIN}/admin/ui`, { redirect: "manual" });
  expect(redirect.status === 308 && redirect.headers.get("location") === "/admin/ui/", "/admin/ui to redirect");

  // A wrong token is refused, in words.
  await page.goto(`${ADMIN}/admin/ui/`);
  await page.fill("#token", "not-the-admin-token-0123456789");
  await page.click("#sign-in-form button[type=submit]");
  await page.waitForSelector("#message:not([hidden])");
  const refusal = await page.textContent("#message");
  expect(refusal.includes("admin token was refused"), `the refusal to be explained (got: ${refusal})`);
  expect(await page.isVisible("#sign-in"), "the sign-in form after a refusal");
  expect(!(await page.evaluate(() => sessionStorage.length)), "a refused token not to be kept");
  await shoot("sign-in-refused");

  // Signed in: the gateway view counts what just happened.
  expect((await request("order-7", "Bearer client-7")).status === 201, "the first request to run");
  expect((await request("order-7", "Bearer client-7")).replayed, "the retry to be replayed");
  expect((await ask("upstream-count")) === "1", "one request at the upstream");
  await page.fill("#token", TOKEN);
  await page.click("#sign-in-form button[type=submit]");
  await page.waitForSelector("#gateway:not([hidden]) #outcomes tbody tr");
  expect(!page.url().includes(TOKEN), "the token never in the URL");
  expect((await desktop.cookies()).length === 0, "no cookie");
  const replayedRow = page.locator("#outcomes tbody tr", { hasText: "Replayed" });
  // The 15-minute column: the two requests may straddle a minute's end.
  expect((await replayedRow.locator("td").nth(2).textContent()) === "1", "one replay in the last 15 minutes");
  await shoot("gateway");

  // A key is looked up (metadata, never the body), then purged after a confirmation.
  await page.fill("#lookup-key", "order-7");
  await page.fill("#lookup-tenant", "Bearer client-7");
  await page.click("#lookup-form button[type=submit]");
  await page.waitForSelector("#record:not([hidden])");
  const record = await page.textContent("#record-fields");
  expect(record.includes("completed") && record.includes("201"), `the record's state and status (got: ${record})`);
  await shoot("key");
  await page.click("#purge");
  await page.waitForSelector("#confirm[open]");
  const warning = await page.textContent("#confirm-text");
  expect(warning.includes("runs again"), `the confirmation to say what purge means (got: ${warning})`);
  await shoot("purge-confirm");
  await page.click("#confirm-ok");
  await page.waitForSelector("#message.ok:not([hidden])");
  const again = await request("order-7", "Bearer client-7");
  expect(again.status === 201 && !again.replayed, "the next request to run again");
  expect((await ask("upstream-count")) === "2", "the purged key executed once more at the upstream");

  // The outbox: a dead head with its reason (escaped), and the row it holds.
  await page.click("#show-outbox");
  await page.waitForSelector("#outbox:not([hidden]) #dead li");
  const sink = page.locator("#destinations tbody tr", { hasText: "sink" });
  const cells = await sink.locator("td").allTextContents();
  expect(cells[2] === "1" && cells[3] === "1", `sink: 1 dead, 1 held (got ${cells})`);
  const card = page.locator("#dead li").first();
  const text = await card.textContent();
  expect(text.includes("<b>order-9</b>"), `the business key shown as text (got: ${text})`);
  expect((await page.locator("#dead b").count()) === 0, "no markup from the database rendered");
  expect(text.includes("400"), `the last error to name the refusal (got: ${text})`);
  expect(text.includes("Holds 1 later row"), "the held row shown as held");
  expect(text.includes("4bf92f3577b34da6a3ce929d0e0e4736"), `the trace id of the row shown (got: ${text})`);
  // The dead rows of one destination: the filter offers every destination listed.
  await page.selectOption("#dead-destination", "sink");
  await page.waitForSelector("#dead li");
  expect((await page.textContent("#dead-range")).includes("of 1"), "sink's one dead row under the filter");
  await shoot("outbox");
  // docs/operating.md's picture (docs/console.png): the viewport only, small.
  await page.setViewportSize({ width: 960, height: 620 });
  await page.screenshot({ path: join(SHOTS, "readme.png") });
  await page.setViewportSize(WIDTHS.desktop);

  // "Redrive all" asks first; cancelled, nothing moves.
  await page.click("#redrive-all");
  await page.waitForSelector("#confirm[open]");
  expect((await page.textContent("#confirm-text")).includes("Every dead row"), "the redrive-all warning");
  await page.click("#confirm-cancel");
  await page.click("#refresh");
  await page.waitForSelector("#dead li");
  expect((await sink.locator("td").nth(2).textContent()) === "1", "still one dead row after a cancelled redrive-all");

  // Redrive, once the destination accepts: delivered, and gone from the list.
  expect((await ask("sink-accept")) === "ok", "the destination to accept now");
  await card.locator("button").click();
  await page.waitForSelector("#confirm[open]");
  await shoot("redrive-confirm");
  await page.click("#confirm-ok");
  await page.waitForSelector("#message.ok:not([hidden])");
  await refreshUntil("both rows to be delivered", async () => {
    const counts = await sink.locator("td").allTextContents();
    return counts[0] === "0" && counts[1] === "0" && counts[2] === "0" && (await page.isVisible("#dead-empty"));
  });
  expect((await ask("delivered")) === "2", "both rows delivered");

  // The standalone relay's listener serves the same console, outbox only.
  const relayPage = await desktop.newPage();
  watch(relayPage, "relay");
  await relayPage.goto(`${RELAY_ADMIN}/admin/ui/`);
  await relayPage.fill("#token", TOKEN);
  await relayPage.click("#sign-in-form button[type=submit]");
  await relayPage.waitForSelector("#outbox:not([hidden]) #destinations tbody tr");
  expect(await relayPage.isHidden("#show-gateway"), "no gateway view on a relay");
  await shoot("relay-outbox", relayPage);

  expect(problems.length === 0, `no console errors or CSP violations: ${problems.join("; ")}`);
  // And the policy is in force: an injected inline script does not run.
  const ran = await page.evaluate(() => {
    const script = document.createElement("script");
    script.textContent = "window.injected = true";
    document.body.append(script);
    return window.injected === true;
  });
  expect(!ran, "the Content-Security-Policy to refuse inline script");
  console.error(`console.mjs: all steps passed; screenshots in ${SHOTS}`);
} catch (error) {
  await page.screenshot({ path: join(SHOTS, "failure.png"), fullPage: true }).catch(() => {});
  console.error(`console.mjs: ${error.message}`);
  if (problems.length) console.error(`page problems: ${problems.join("; ")}`);
  process.exitCode = 1;
} finally {
  await browser.close();
  process.stdin.destroy();
}
