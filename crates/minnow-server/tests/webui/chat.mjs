// Drives llama.cpp's web UI (served by `minnow serve --ui-dir`) in headless Chromium, as a user
// would: load it, type a message, send it, watch the answer stream in, regenerate it, stop a
// generation, and fail on any error dialog, page error or failed API call. Run by
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

  step('load');
  await page.goto(base, { waitUntil: 'networkidle2' });
  const input = await page.waitForSelector('[data-slot="input-area"] textarea, textarea');

  const assistantText = () => page.evaluate(() => {
    // Message bubbles: the last one belongs to the assistant once it has answered.
    const nodes = [...document.querySelectorAll('[data-role="assistant"], .chat-message-assistant, [aria-label="Assistant message"]')];
    return nodes.length ? nodes[nodes.length - 1].innerText.trim() : '';
  });
  const errorDialog = () => page.evaluate(() => {
    const dialogs = [...document.querySelectorAll('[role="alertdialog"], [role="dialog"], [data-sonner-toast][data-type="error"]')];
    return dialogs.map((d) => d.innerText.trim()).filter((t) => t.length > 0).join(' | ');
  });

  step('type and send');
  await input.type('Hello! Please tell me about rivers.');
  await page.keyboard.press('Enter');

  step('wait for the streamed answer');
  await page.waitForFunction(() => document.body.innerText.includes('Hello! Please tell me about rivers.'));
  await page.waitForResponse((r) => r.url().endsWith('/v1/chat/completions'));
  // Streaming finishes when the UI offers its message actions again (regenerate).
  await page.waitForSelector('[aria-label="Regenerate"], button[title="Regenerate"]', { timeout: 60_000 }).catch(() => {});
  const answer = await assistantText();
  step(`answer: ${JSON.stringify(answer.slice(0, 80))}`);

  const dialog = await errorDialog();
  if (dialog) problems.push(`error dialog: ${dialog}`);
  if (completions.length === 0) problems.push('the UI never called /v1/chat/completions');
  for (const c of completions) {
    if (c.status !== 200 || !c.type.startsWith('text/event-stream')) {
      problems.push(`chat completion answered ${c.status} ${c.type}`);
    }
  }
  console.log(JSON.stringify({ answer: answer.slice(0, 200), completions, problems }));
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
