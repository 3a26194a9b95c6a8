// The Files page: uploads (several files, or a folder) with a progress bar each, and
// deletes with a confirmation, through the API with the session's CSRF token. Uploads
// use XMLHttpRequest, whose upload events report progress (fetch has none).
(function () {
  const box = document.getElementById('files');
  if (!box) return;
  const api = box.dataset.api;
  const dir = box.dataset.dir;
  const csrf = box.dataset.csrf;
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

  // One file: a line with its name, a <progress> and what happened. Resolves true when stored.
  function upload(file, path, list) {
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
    return new Promise(function (resolve) {
      const xhr = new XMLHttpRequest();
      xhr.open('PUT', url(path));
      xhr.setRequestHeader('X-CSRF-Token', csrf);
      xhr.setRequestHeader('Content-Type', 'application/octet-stream');
      xhr.upload.onprogress = function (e) {
        bar.value = e.loaded;
        state.textContent = Math.floor(100 * e.loaded / (e.total || 1)) + ' %';
      };
      xhr.onload = function () {
        const ok = xhr.status >= 200 && xhr.status < 300;
        bar.value = bar.max;
        state.textContent = ok ? 'stored' : 'refused: ' + why(xhr.status, xhr.responseText);
        li.className = ok ? 'done' : 'failed';
        resolve(ok);
      };
      xhr.onerror = function () {
        state.textContent = 'failed: the connection was lost; nothing of it was kept, try again';
        li.className = 'failed';
        resolve(false);
      };
      state.textContent = 'uploading';
      xhr.send(file);
    });
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
