import { useState } from "react";
import { useSession } from "../session";
import type { Theme } from "../theme";

export function Settings({ theme, onToggleTheme }: { theme: Theme; onToggleTheme: () => void }) {
  const session = useSession();
  const [url, setUrl] = useState(session.conn.baseUrl);
  const [key, setKey] = useState("");
  const [remember, setRemember] = useState(false);
  return (
    <section aria-labelledby="settings-title" className="settings">
      <h1 id="settings-title">Settings</h1>
      <form
        onSubmit={(e) => {
          e.preventDefault();
          session.setBaseUrl(url);
        }}
      >
        <label htmlFor="base-url">OpenAI base URL</label>
        <div className="row">
          <input id="base-url" value={url} onChange={(e) => setUrl(e.target.value)} spellCheck={false} />
          <button type="submit">Connect</button>
        </div>
        <p className="muted">Any OpenAI-compatible server works; colibri-only views say so when the server lacks their endpoint.</p>
      </form>
      <label htmlFor="model">Model</label>
      <select id="model" value={session.model ?? ""} onChange={(e) => session.setModel(e.target.value)} disabled={session.models.length === 0}>
        {session.models.map((m) => (
          <option key={m.id} value={m.id}>
            {m.id}
          </option>
        ))}
      </select>
      <form
        onSubmit={(e) => {
          e.preventDefault();
          session.setKey(key.trim(), remember);
          setKey("");
        }}
      >
        <label htmlFor="settings-key">API key {session.conn.apiKey ? "(one is set)" : "(none set)"}</label>
        <div className="row">
          <input id="settings-key" type="password" autoComplete="off" value={key} onChange={(e) => setKey(e.target.value)} />
          <button type="submit">Use key</button>
        </div>
        <label className="check">
          <input type="checkbox" checked={remember} onChange={(e) => setRemember(e.target.checked)} /> Remember on this device
        </label>
      </form>
      <p>
        Theme: {theme}{" "}
        <button type="button" onClick={onToggleTheme}>
          Switch to {theme === "dark" ? "light" : "dark"}
        </button>
      </p>
      <p className="muted">
        Endpoints: models <code>{session.conn.baseUrl}/models</code> · health polled every 5 s · Brain polls /experts every 1.5 s · Profiling polls
        /profile every 2 s.
      </p>
    </section>
  );
}
