// The Files page: uploads (several files, or a folder) with a progress bar each, and
// deletes with a confirmation, through the API with the session's CSRF token. Uploads
// use XMLHttpRequest, whose upload events report progress (fetch has none).
//
// A file larger than one part goes in parts (/api/v1/uploads): a part that fails is sent
// again after a pause, and a file whose upload stopped (a lost connection, a closed tab)
// resumes where it stopped when the same file is chosen again for the same place.
(function () {
  const box = document.getElementById('files');
  if (!box) return;
  const api = box.dataset.api;
  const dir = box.dataset.dir;
  const csrf = box.dataset.csrf;
  const spaceRef = box.dataset.ref || '';
  const PART_ABOVE = 8 * 1024 * 1024;
  const RETRIES = 6;
  const errorBox = document.getElementById('files-error');

  function url(path) {
    return api + '/' + path.split('/').map(encodeURIComponent).join('/');
  }
  function showError(text) {
    errorBox.textContent = text;
    errorBox.hidden = false;
  }
  function why(xhrStatus, body) {
    try {
      const e = JSON.parse(body);
      if (e && e.message) return e.message;
    } catch (_) { /* not JSON */ }
    return 'the portal answered ' + xhrStatus;
  }
  function sizeText(n) {
    const units = ['B', 'kB', 'MB', 'GB', 'TB'];
    let u = 0;
    while (n >= 1000 && u < units.length - 1) { n /= 1000; u++; }
    return (u === 0 ? n : n.toFixed(1)) + ' ' + units[u];
  }

  // One file's line: its name, a <progress> and what happened.
  function line(file, path, list) {
    const li = document.createElement('li');
    const name = document.createElement('span');
    name.textContent = path + ' (' + sizeText(file.size) + ')';
    const bar = document.createElement('progress');
    bar.max = file.size || 1;
    bar.value = 0;
    const state = document.createElement('span');
    state.className = 'state';
    state.textContent = 'waiting';
    li.append(name, ' ', bar, ' ', state);
    list.append(li);
    return {
      li: li, bar: bar,
      say: function (text) { state.textContent = text; },
      end: function (ok, text) {
        state.textContent = text;
        li.className = ok ? 'done' : 'failed';
        if (ok) bar.value = bar.max;
        return ok;
      },
    };
  }

  // Sends `body` with XMLHttpRequest; resolves {status, text} (status 0: no answer).
  function send(method, target, body, type, onProgress) {
    return new Promise(function (resolve) {
      const xhr = new XMLHttpRequest();
      xhr.open(method, target);
      xhr.setRequestHeader('X-CSRF-Token', csrf);
      if (type) xhr.setRequestHeader('Content-Type', type);
      if (onProgress) xhr.upload.onprogress = function (e) { onProgress(e.loaded); };
      xhr.onload = function () { resolve({ status: xhr.status, text: xhr.responseText }); };
      xhr.onerror = function () { resolve({ status: 0, text: '' }); };
      xhr.send(body);
    });
  }
  const ok = function (r) { return r.status >= 200 && r.status < 300; };
  // Worth sending again: no answer, or the portal busy or briefly away.
  const transient = function (r) { return r.status === 0 || r.status === 408 || r.status === 429 || r.status >= 500; };
  const pause = function (ms) { return new Promise(function (r) { setTimeout(r, ms); }); };

  // A small file: one request. Resolves true when stored.
  async function uploadWhole(file, path, ui) {
    ui.say('uploading');
    const r = await send('PUT', url(path), file, 'application/octet-stream', function (loaded) {
      ui.bar.value = loaded;
      ui.say(Math.floor(100 * loaded / (file.size || 1)) + ' %');
    });
    if (ok(r)) return ui.end(true, 'stored');
    if (r.status === 0) return ui.end(false, 'failed: the connection was lost; nothing of it was kept, try again');
    return ui.end(false, 'refused: ' + why(r.status, r.text));
  }

  // A large file, in parts; resumes an unfinished upload of the same file to the same place.
  async function uploadParts(file, path, ui) {
    const target = spaceRef + path;
    let up = null;
    const mine = await send('GET', '/api/v1/uploads', null, null, null);
    if (ok(mine)) {
      up = JSON.parse(mine.text).find(function (u) { return u.path === target && u.size === file.size; }) || null;
    }
    if (up && up.received.length > 0) {
      ui.say('resuming: ' + sizeText(up.received_bytes) + ' were stored before');
    }
    if (!up) {
      const r = await send('POST', '/api/v1/uploads', JSON.stringify({ path: target, size: file.size }), 'application/json', null);
      if (!ok(r)) return ui.end(false, 'refused: ' + why(r.status, r.text));
      up = JSON.parse(r.text);
    }
    ui.li.dataset.upload = up.id;
    const have = new Set(up.received);
    let done = up.received_bytes;
    ui.bar.value = done;
    for (let n = 0; n < up.parts; n++) {
      if (have.has(n)) continue;
      const from = n * up.part_bytes;
      const part = file.slice(from, Math.min(from + up.part_bytes, file.size));
      let sent = false;
      for (let attempt = 0; attempt <= RETRIES && !sent; attempt++) {
        const r = await send('PUT', '/api/v1/uploads/' + up.id + '/parts/' + n, part, 'application/octet-stream', function (loaded) {
          ui.bar.value = done + loaded;
          ui.say(Math.floor(100 * (done + loaded) / (file.size || 1)) + ' %');
        });
        if (ok(r)) { sent = true; break; }
        if (!transient(r)) return ui.end(false, 'refused: ' + why(r.status, r.text));
        if (attempt < RETRIES) {
          const wait = Math.min(30, 2 ** attempt);
          ui.say('the connection was lost; trying part ' + (n + 1) + ' of ' + up.parts + ' again in ' + wait + ' s');
          await pause(wait * 1000);
        }
      }
      if (!sent) {
        return ui.end(false, 'paused: the connection was lost. ' + sizeText(done) +
          ' are kept for a day: choose the same file again to go on from there');
      }
      done += part.size;
    }
    ui.say('joining the parts');
    const r = await send('POST', '/api/v1/uploads/' + up.id + '/complete', null, null, null);
    if (ok(r)) return ui.end(true, 'stored');
    return ui.end(false, 'refused: ' + why(r.status, r.text));
  }

  // One file. Resolves true when stored.
  function upload(file, path, list) {
    const ui = line(file, path, list);
    return file.size > PART_ABOVE ? uploadParts(file, path, ui) : uploadWhole(file, path, ui);
  }

  const form = document.getElementById('upload');
  // Set here: the attribute is not (yet) in the HTML standard, so the page stays valid.
  const folderInput = document.getElementById('upload-folder');
  if (folderInput) folderInput.webkitdirectory = true;
  if (form) {
    form.addEventListener('submit', async function (ev) {
      ev.preventDefault();
      errorBox.hidden = true;
      const list = document.getElementById('progress');
      list.textContent = '';
      const picked = [];
      for (const f of document.getElementById('upload-files').files) picked.push([f, dir + f.name]);
      for (const f of folderInput.files) {
        picked.push([f, dir + (f.webkitRelativePath || f.name)]);
      }
      if (picked.length === 0) {
        showError('Choose files or a folder to upload first.');
        return;
      }
      let failed = 0;
      // One after the other: each gets the whole connection, and the quota counts them in order.
      for (const [f, path] of picked) {
        if (!(await upload(f, path, list))) failed++;
      }
      if (failed === 0) {
        window.location.reload();
      } else {
        showError(failed + ' of ' + picked.length + ' uploads failed: see why beside each.');
      }
    });
  }

  box.addEventListener('click', async function (ev) {
    const b = ev.target.closest('button.delete');
    if (!b) return;
    const path = b.dataset.path;
    if (!window.confirm('Delete ' + path + '? This cannot be undone.')) return;
    b.disabled = true;
    const r = await fetch(url(path), { method: 'DELETE', headers: { 'X-CSRF-Token': csrf } });
    if (r.ok) {
      window.location.reload();
    } else {
      b.disabled = false;
      showError('Could not delete ' + path + ': ' + why(r.status, await r.text()));
    }
  });
})();
