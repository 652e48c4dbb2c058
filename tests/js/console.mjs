// Drives the sless console in Debian's chromium (playwright-core), as
// tests/test_console.py asks: sign-in, a queue service becoming Ready, keys
// hidden until asked, a dataflow created through the form (a 422 shown at
// the field it names first), its counters moving, another tenant seeing
// none of it, and a phone-sized screen. Screenshots go to SHOTS.
import { chromium } from "playwright-core";
import assert from "node:assert/strict";

const { API, TOKEN_A, TOKEN_B, PG_DSN, SRC, DST, SHOTS } = process.env;
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";

const browser = await chromium.launch({ executablePath: CHROMIUM, args: ["--no-sandbox"] });
const requests = [];
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  const page = await context.newPage();
  page.on("request", (r) => requests.push(r.url()));
  const errors = [];
  page.on("pageerror", (e) => {
    errors.push(e.message);
    process.stderr.write(`page error: ${e.message}\n`);
  });
  page.on("console", (m) => process.stderr.write(`console ${m.type()}: ${m.text()}\n`));

  // Sign-in: a wrong token is refused, the right one opens the overview.
  await page.goto(`${API}/console`);
  await page.fill("#token", "not-a-token");
  await page.click("#sign-in button[type=submit]");
  await page.waitForSelector("#sign-in-error:has-text('not valid')");
  await page.fill("#token", TOKEN_A);
  await page.click("#sign-in button[type=submit]");
  await page.waitForSelector("#queue-services", { state: "attached" });
  assert.equal(await page.evaluate(() => localStorage.length), 0, "nothing in localStorage");
  assert.equal(await page.evaluate(() => sessionStorage.getItem("sless.token")), TOKEN_A);

  // A queue service, created here, becomes Ready on its own.
  await page.fill("#new-queue-service", "main");
  await page.click("form:has(#new-queue-service) button[type=submit]");
  await page.waitForSelector(".queue-service[data-name=main] .phase[data-phase=Ready]", { timeout: 30000 });
  const hidden = await page.textContent(".queue-service[data-name=main] .secret");
  assert.match(hidden, /^•+$/, "the secret key is hidden until asked");
  await page.click(".queue-service[data-name=main] button.reveal");
  await page.waitForFunction(() => !/^•+$/.test(document.querySelector(".queue-service[data-name=main] .secret").textContent));
  const endpoint = await page.textContent(".queue-service[data-name=main] dd code");
  assert.match(endpoint, /^http:\/\/127\.0\.0\.1:\d+\/sqs\/a$/);
  await page.screenshot({ path: `${SHOTS}/overview.png`, fullPage: true });

  // Its queues: create one, send a message, watch the depth change, peek.
  await page.click(".queue-service[data-name=main] h3 a");
  await page.waitForSelector("#new-queue");
  await page.fill("#new-queue", "jobs");
  await page.click("form:has(#new-queue) button[type=submit]");
  await page.waitForSelector(".queue[data-queue=jobs]");
  assert.equal(await page.textContent(".queue[data-queue=jobs] [data-count=visible] b"), "0");
  await page.fill("#send-jobs", "<img src=x onerror=alert(1)> hello");
  await page.click(".queue[data-queue=jobs] form button[type=submit]");
  await page.waitForFunction(() => document.querySelector(".queue[data-queue=jobs] [data-count=visible] b")?.textContent === "1");
  await page.click(".queue[data-queue=jobs] button.peek");
  await page.waitForSelector(".queue[data-queue=jobs] .peeked pre");
  assert.match(await page.textContent(".queue[data-queue=jobs] .peeked pre"), /<img src=x onerror=alert\(1\)> hello/);
  assert.equal(await page.$$eval(".peeked img", (n) => n.length), 0, "a message body is text, never markup");
  assert.equal(await page.textContent(".queue[data-queue=jobs] [data-count=visible] b"), "1", "peeking consumes nothing");
  // The oldest message's age, from sless's own queue attribute, grows.
  await page.waitForFunction(() => /^[1-9]\d* s$/.test(document.querySelector(".queue[data-queue=jobs] [data-count=oldest] b")?.textContent), null, { timeout: 10000 });
  await page.fill("#new-queue", "../etc");
  await page.click("form:has(#new-queue) button[type=submit]");
  await page.waitForSelector("#new-queue-error:has-text('must be 1 to 80')");
  await page.screenshot({ path: `${SHOTS}/queues.png`, fullPage: true });

  // A dataflow through the form: the bad condition is shown at its field.
  await page.goto(`${API}/console#/dataflows/new`);
  await page.fill("[data-field=name] input", "console-flow");
  await page.fill("[data-field=source] textarea", JSON.stringify({ type: "postgresql", config: { connectionString: PG_DSN, table: SRC, pollInterval: 1 } }));
  await page.fill("[data-field=transformations] textarea", JSON.stringify([{ type: "filter", config: { condition: "amount >" } }]));
  await page.fill("[data-field=sink] textarea", JSON.stringify({ type: "postgresql", config: { connectionString: PG_DSN, table: DST, autoCreateTable: true } }));
  await page.click("#dataflow-form button[type=submit]");
  await page.waitForSelector("[data-field=transformations].invalid");
  const message = await page.textContent("[data-error-for=transformations]");
  assert.match(message, /transformations\[0\]\.config\.condition/);
  assert.equal(await page.$$eval("label.invalid", (l) => l.length), 1, "only the field named is marked");
  await page.screenshot({ path: `${SHOTS}/dataflow-422.png`, fullPage: true });
  await page.fill("[data-field=transformations] textarea", JSON.stringify([
    { type: "filter", config: { condition: "amount > 5" } },
    { type: "mask", config: { fields: ["card"], keepLength: true } },
  ]));
  await page.click("#dataflow-form button[type=submit]");
  await page.waitForURL(/#\/dataflows\/console-flow$/);

  // Its counters move and the page follows without a reload.
  await page.waitForSelector(".phase[data-phase=Running]", { timeout: 30000 });
  await page.waitForFunction(() => Number(document.querySelector("[data-counter=written] b")?.textContent) >= 45, null, { timeout: 30000 });
  assert.equal(await page.textContent("[data-counter=filtered] b"), "5");
  await page.waitForSelector("#pipeline .stage:has-text('filter')");
  // The platform's events: the processor started, then ran.
  await page.waitForSelector("#events li[data-reason=Running]");
  assert.match(await page.textContent("#events li:last-child"), /Pending connecting the source and sinks/);
  await page.waitForTimeout(4500); // a few samples for the chart
  await page.screenshot({ path: `${SHOTS}/dataflow.png`, fullPage: true });

  // Edited through the form: the name is fixed, the change is saved.
  await page.click("a:has-text('Edit')");
  await page.waitForSelector("#dataflow-form");
  assert.equal(await page.getAttribute("[data-field=name] input", "readonly"), "");
  await page.fill("[data-field=transformations] textarea", JSON.stringify([
    { type: "filter", config: { condition: "amount > 10" } },
    { type: "mask", config: { fields: ["card"], keepLength: true } },
  ]));
  await page.click("#dataflow-form button[type=submit]");
  await page.waitForURL(/#\/dataflows\/console-flow$/);
  const saved = await page.evaluate(async () => {
    const r = await fetch("/api/v1/dataflows/console-flow", { headers: { Authorization: "Bearer " + sessionStorage.getItem("sless.token") } });
    return (await r.json()).transformations[0].config.condition;
  });
  assert.equal(saved, "amount > 10");
  await page.waitForSelector(".phase[data-phase=Running]", { timeout: 30000 });
  // The restart for the new spec is in the events, newest first.
  await page.waitForFunction(() => [...document.querySelectorAll("#events li")].map((li) => li.dataset.reason).join(",") === "Running,Pending,Running,Pending", null, { timeout: 10000 });

  // On a phone-sized screen.
  await page.setViewportSize({ width: 390, height: 844 });
  await page.waitForTimeout(500);
  await page.screenshot({ path: `${SHOTS}/dataflow-phone.png`, fullPage: true });
  assert.ok(await page.evaluate(() => document.documentElement.scrollWidth <= window.innerWidth + 1), "no sideways scrolling on a phone");

  // Another tenant, in its own browser context, sees none of it.
  const other = await (await browser.newContext()).newPage();
  await other.goto(`${API}/console`);
  await other.fill("#token", TOKEN_B);
  await other.click("#sign-in button[type=submit]");
  await other.waitForSelector("#queue-services", { state: "attached" });
  assert.equal(await other.$$eval(".queue-service[data-name=main]", (n) => n.length), 0);
  assert.equal(await other.$$eval(".dataflow[data-name=console-flow]", (n) => n.length), 0);
  await other.goto(`${API}/console#/dataflows/console-flow`);
  await other.waitForSelector("p.error");
  await other.goto(`${API}/console#/queue-services/main`);
  await other.waitForSelector("p.error:has-text('not found')");
  await other.screenshot({ path: `${SHOTS}/other-tenant.png`, fullPage: true });

  assert.deepEqual(errors, [], "no script errors");
  assert.ok(!requests.some((u) => u.includes(TOKEN_A)), "the token is never in a URL");
  console.log(JSON.stringify({ ok: true, requests: requests.length }));
} finally {
  await browser.close();
}
