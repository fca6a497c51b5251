// Drives llama.cpp's web UI (served by `minnow serve --ui-dir`) in headless Chromium, as a user
// would: with its sampling settings set, load it, type a message, send it, watch the answer stream
// in with its timings, regenerate it, then send a long one and press stop while it streams.
// Checks: the text on screen is the streamed content, every request carried the user's settings
// and no unknown field (`x-minnow-ignored-fields` absent), the stopped stream never completed, and
// no error dialog, page error or failed API call. Run by tests/webui_browser.rs with
// MINNOW_BASE_URL, MINNOW_CHROMIUM and MINNOW_PROFILE_DIR set; the Rust side checks on the server
// that the stopped request was cancelled.
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
// Short answers while chatting; the answer that gets stopped may run to the end of the context.
const SHORT = 48;
const LONG = 1024;

const problems = [];
const completions = [];
const requests = [];
const step = (what) => console.log(`[webui] ${what}`);
// Letters and digits only: how the on-screen text (markdown rendered, whitespace reflowed) is
// compared with the streamed content.
const alnum = (s) => (s || '').replace(/[^\p{L}\p{N}]/gu, '');
// The input area's stop button (an icon button whose label is a screen-reader-only "Stop").
const STOP = '::-p-xpath(//button[.//span[contains(@class, "sr-only") and normalize-space() = "Stop"]])';

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
  console.error(problems.join('\n'));
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
      completions.push({ status, type, ignored: response.headers()['x-minnow-ignored-fields'] ?? null });
    }
  });

  // The user's sampling settings, as the settings dialog stores them (values and "overridden"
  // marks, so the UI does not replace them with the server's /props defaults).
  const settings = { temperature: 0.7, top_k: 20, top_p: 0.9, max_tokens: SHORT };
  await page.evaluateOnNewDocument((config) => {
    if (!localStorage.getItem('LlamaUi.config')) {
      localStorage.setItem('LlamaUi.config', JSON.stringify(config));
      localStorage.setItem('LlamaUi.userOverrides', JSON.stringify(Object.keys(config)));
    }
  }, settings);
  // A copy of every streamed chat completion, read as the UI reads it: the content and reasoning
  // deltas, the finish reason, whether `[DONE]` arrived, how the body ended.
  await page.evaluateOnNewDocument(() => {
    window.__minnowStreams = [];
    const fetch = window.fetch.bind(window);
    window.fetch = async (input, init) => {
      const response = await fetch(input, init);
      const url = new URL(typeof input === 'string' ? input : input.url, location.href);
      let streamed = false;
      try { streamed = JSON.parse(init?.body || '{}').stream === true; } catch {}
      if (url.pathname !== '/v1/chat/completions' || !streamed || !response.body) return response;
      const [copy, forUi] = response.body.tee();
      const record = { content: '', reasoning: '', finish: null, done: false, ended: null };
      window.__minnowStreams.push(record);
      (async () => {
        const reader = copy.getReader();
        const decoder = new TextDecoder();
        let buffer = '';
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += decoder.decode(value, { stream: true });
          let end;
          while ((end = buffer.indexOf('\n\n')) >= 0) {
            const event = buffer.slice(0, end);
            buffer = buffer.slice(end + 2);
            if (!event.startsWith('data: ')) continue;
            const data = event.slice(6);
            if (data === '[DONE]') { record.done = true; continue; }
            const choice = JSON.parse(data).choices?.[0];
            record.content += choice?.delta?.content || '';
            record.reasoning += choice?.delta?.reasoning_content || '';
            record.finish = choice?.finish_reason || record.finish;
          }
        }
        record.ended = 'complete';
      })().catch((e) => { record.ended = `error: ${e.name}`; });
      return new Response(forUi, { status: response.status, statusText: response.statusText, headers: response.headers });
    };
  });
  page.on('request', (request) => {
    if (request.method() === 'POST' && new URL(request.url()).pathname === '/v1/chat/completions') {
      try { requests.push(JSON.parse(request.postData() || '{}')); } catch { requests.push({}); }
    }
  });

  step('load');
  await page.goto(base, { waitUntil: 'networkidle2' });
  let input = await page.waitForSelector('[data-slot="input-area"] textarea');

  const answers = () => page.evaluate(() =>
    [...document.querySelectorAll('[aria-label="Assistant message with actions"]')]
      .map((m) => m.innerText.trim()));
  const streams = () => page.evaluate(() => window.__minnowStreams.map((s) => ({ ...s })));
  const errorDialog = () => page.evaluate(() =>
    [...document.querySelectorAll('[role="alertdialog"], [role="dialog"], [data-sonner-toast][data-type="error"]')]
      .map((d) => d.innerText.trim()).filter((t) => t.length > 0).join(' | '));
  // Stream n (1-based) has been read to its end by the copy.
  const streamEnded = (n) => page.waitForFunction(
    (n) => window.__minnowStreams.length >= n && window.__minnowStreams[n - 1].ended !== null,
    { timeout: 60_000 }, n);
  // The newest answer on screen holds the newest stream's content (letters and digits, in order).
  const checkShown = async (what) => {
    const shown = await answers();
    const all = await streams();
    const last = all[all.length - 1];
    const screen = shown[shown.length - 1] || '';
    step(`${what}: ${JSON.stringify(screen.slice(0, 80))}`);
    if (!last || last.ended !== 'complete' || !last.done) {
      problems.push(`${what}: the stream did not complete: ${JSON.stringify(last)}`);
      return;
    }
    if (alnum(last.content).length === 0) {
      problems.push(`${what}: the streamed content has no letters or digits to compare: ${JSON.stringify(last.content)}`);
    } else if (!alnum(screen).includes(alnum(last.content))) {
      problems.push(`${what}: the screen shows ${JSON.stringify(screen)}, the stream said ${JSON.stringify(last.content)}`);
    }
  };

  step('type and send');
  const question = 'Hello! Please tell me about rivers.';
  await input.type(question);
  await page.keyboard.press('Enter');
  await page.waitForFunction((q) => document.body.innerText.includes(q), {}, question);

  step('wait for the streamed answer');
  await streamEnded(1);
  await page.waitForSelector('[aria-label="Regenerate"]');
  const first = await answers();
  if (first.length !== 1) problems.push(`expected one answer, saw ${JSON.stringify(first)}`);
  await checkShown('answer');
  // The message statistics come from the stream's timings: "N tokens", a time and "t/s".
  if (!/\d+ tokens/.test(first[0] || '') || !/t\/s/.test(first[0] || '')) {
    problems.push(`no timings under the answer: ${JSON.stringify(first[0])}`);
  }

  step('regenerate');
  await page.click('[aria-label="Regenerate"]');
  await streamEnded(2);
  await page.waitForSelector('[aria-label="Regenerate"]');
  await checkShown('regenerated');

  step('a long answer, stopped while it streams');
  await page.evaluate((long) => {
    const config = JSON.parse(localStorage.getItem('LlamaUi.config'));
    localStorage.setItem('LlamaUi.config', JSON.stringify({ ...config, max_tokens: long }));
  }, LONG);
  await page.reload({ waitUntil: 'networkidle2' });
  input = await page.waitForSelector('[data-slot="input-area"] textarea');
  const before = (await streams()).length; // the copies restart with the page
  await input.type('Now tell me everything about the sea.');
  await page.keyboard.press('Enter');
  // Stop once content is on its way, so the server is mid-generation.
  await page.waitForFunction(
    (n) => window.__minnowStreams.length > n && window.__minnowStreams[n].content.length > 0,
    { timeout: 30_000 }, before);
  await page.click(STOP);
  await streamEnded(before + 1);
  const stopped = (await streams())[before];
  step(`stopped after ${stopped.content.length} characters (${stopped.ended})`);
  if (stopped.done || stopped.finish) {
    problems.push(`the stopped stream ran to its end (the stop came too late): ${JSON.stringify(stopped)}`);
  }
  await page.waitForSelector(STOP, { hidden: true });

  const dialog = await errorDialog();
  if (dialog) problems.push(`error dialog: ${dialog}`);
  if (completions.length < 3) problems.push(`expected 3 chat completions, saw ${completions.length}`);
  for (const c of completions) {
    if (c.status !== 200 || !c.type.startsWith('text/event-stream')) {
      problems.push(`chat completion answered ${c.status} ${c.type}`);
    }
    // Everything the UI sends is a field minnow knows (its own or llama-server's).
    if (c.ignored !== null) problems.push(`the server ignored fields the UI sent: ${c.ignored}`);
  }
  requests.forEach((body, i) => {
    const wanted = { ...settings, max_tokens: i < 2 ? SHORT : LONG };
    for (const [key, value] of Object.entries(wanted)) {
      if (body[key] !== value) problems.push(`request ${i} carried ${key}=${body[key]}, the settings say ${value}`);
    }
    if (body.stream !== true || body.return_progress !== true) problems.push('the UI did not stream with progress');
  });
  // The header check above can fail: a field the server does not know is named in it.
  const probe = await fetch(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 1, not_a_field: 1 }),
  });
  if (probe.headers.get('x-minnow-ignored-fields') !== 'not_a_field') {
    problems.push(`an unknown field was not listed: ${probe.headers.get('x-minnow-ignored-fields')}`);
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
