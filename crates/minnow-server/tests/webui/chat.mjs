// Drives llama.cpp's web UI (served by `minnow serve --ui-dir`) in headless Chromium, as a user
// would: with its sampling settings set, load it, type a message, send it, watch the answer stream
// in with its timings, regenerate it, and fail on any error dialog, page error or failed API call. Run by
// tests/webui_browser.rs with MINNOW_BASE_URL, MINNOW_CHROMIUM and MINNOW_PROFILE_DIR set.
import puppeteer from 'puppeteer-core';

const base = process.env.MINNOW_BASE_URL;
const chromium = process.env.MINNOW_CHROMIUM || '/usr/bin/chromium';
const profile = process.env.MINNOW_PROFILE_DIR;
if (!base || !profile) {
  console.error('MINNOW_BASE_URL and MINNOW_PROFILE_DIR must be set');
  process.exit(2);
}

// Endpoints of llama-server features minnow lacks; the UI probes them and copes with a JSON 404.
const FEATURES_OFF = ['/tools', '/cors-proxy', '/v1/streams/lookup', '/v1/stream', '/models/'];

const problems = [];
const completions = [];
const requests = [];
const step = (what) => console.log(`[webui] ${what}`);

const browser = await puppeteer.launch({
  executablePath: chromium,
  headless: true,
  args: [
    '--headless',
    '--no-sandbox',
    '--disable-gpu',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
    '--no-first-run',
    `--user-data-dir=${profile}`,
  ],
});
const deadline = setTimeout(() => {
  console.error('[webui] timed out');
  process.exit(3);
}, 100_000);

try {
  const page = await browser.newPage();
  page.setDefaultTimeout(30_000);
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('response', async (response) => {
    const url = new URL(response.url());
    if (url.origin !== new URL(base).origin) return;
    const status = response.status();
    const type = response.headers()['content-type'] || '';
    const off = FEATURES_OFF.some((p) => url.pathname.startsWith(p));
    if (off) {
      if (!type.startsWith('application/json')) {
        problems.push(`${url.pathname} answered ${type}, not JSON`);
      }
      return;
    }
    if (status >= 400) {
      let body = '';
      try { body = await response.text(); } catch {}
      problems.push(`${response.request().method()} ${url.pathname} -> ${status} ${body.slice(0, 300)}`);
    }
    if (url.pathname === '/v1/chat/completions') {
      completions.push({ status, type, ignored: response.headers()['x-minnow-ignored-fields'] || '' });
    }
  });

  // The user's sampling settings, as the settings dialog stores them (values and "overridden"
  // marks, so the UI does not replace them with the server's /props defaults).
  const settings = { temperature: 0.7, top_k: 20, top_p: 0.9 };
  await page.evaluateOnNewDocument((config) => {
    if (!localStorage.getItem('LlamaUi.config')) {
      localStorage.setItem('LlamaUi.config', JSON.stringify(config));
      localStorage.setItem('LlamaUi.userOverrides', JSON.stringify(Object.keys(config)));
    }
  }, settings);
  page.on('request', (request) => {
    if (request.method() === 'POST' && new URL(request.url()).pathname === '/v1/chat/completions') {
      try { requests.push(JSON.parse(request.postData() || '{}')); } catch { requests.push({}); }
    }
  });

  step('load');
  await page.goto(base, { waitUntil: 'networkidle2' });
  const input = await page.waitForSelector('[data-slot="input-area"] textarea');

  const answers = () => page.evaluate(() =>
    [...document.querySelectorAll('[aria-label="Assistant message with actions"]')]
      .map((m) => m.innerText.trim()));
  const errorDialog = () => page.evaluate(() =>
    [...document.querySelectorAll('[role="alertdialog"], [role="dialog"], [data-sonner-toast][data-type="error"]')]
      .map((d) => d.innerText.trim()).filter((t) => t.length > 0).join(' | '));
  // A completion is over when its response body has been read to the end.
  const finished = (n) => page.waitForFunction(
    (n) => window.__minnowDone >= n, { timeout: 60_000 }, n);
  page.on('requestfinished', (request) => {
    if (new URL(request.url()).pathname === '/v1/chat/completions') {
      page.evaluate(() => { window.__minnowDone = (window.__minnowDone || 0) + 1; }).catch(() => {});
    }
  });

  step('type and send');
  const question = 'Hello! Please tell me about rivers.';
  await input.type(question);
  await page.keyboard.press('Enter');
  await page.waitForFunction((q) => document.body.innerText.includes(q), {}, question);

  step('wait for the streamed answer');
  await finished(1);
  await page.waitForSelector('[aria-label="Regenerate"]');
  const first = await answers();
  step(`answer: ${JSON.stringify((first[0] || '').slice(0, 80))}`);
  if (first.length !== 1 || first[0].length === 0) problems.push(`no answer shown: ${JSON.stringify(first)}`);
  // The message statistics come from the stream's timings: "N tokens", a time and "t/s".
  if (!/\d+ tokens/.test(first[0] || '') || !/t\/s/.test(first[0] || '')) {
    problems.push(`no timings under the answer: ${JSON.stringify(first[0])}`);
  }

  step('regenerate');
  await page.click('[aria-label="Regenerate"]');
  await finished(2);
  await page.waitForSelector('[aria-label="Regenerate"]');
  const second = await answers();
  step(`regenerated: ${JSON.stringify((second[second.length - 1] || '').slice(0, 80))}`);
  if (second.length === 0 || second[second.length - 1].length === 0) problems.push('no regenerated answer');

  const dialog = await errorDialog();
  if (dialog) problems.push(`error dialog: ${dialog}`);
  if (completions.length < 2) problems.push(`expected 2 chat completions, saw ${completions.length}`);
  for (const c of completions) {
    if (c.status !== 200 || !c.type.startsWith('text/event-stream')) {
      problems.push(`chat completion answered ${c.status} ${c.type}`);
    }
  }
  for (const body of requests) {
    for (const [key, value] of Object.entries(settings)) {
      if (body[key] !== value) problems.push(`request carried ${key}=${body[key]}, the settings say ${value}`);
    }
    if (body.stream !== true || body.return_progress !== true) problems.push('the UI did not stream with progress');
  }
  console.log(JSON.stringify({ completions, problems }));
  if (problems.length > 0) {
    console.error(problems.join('\n'));
    process.exitCode = 1;
  }
} catch (e) {
  console.error(`[webui] ${e.stack || e}`);
  console.error(problems.join('\n'));
  process.exitCode = 1;
} finally {
  clearTimeout(deadline);
  await browser.close();
}
