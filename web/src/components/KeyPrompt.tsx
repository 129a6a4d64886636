import { useEffect, useRef, useState } from "react";
import { useSession } from "../session";

/** The clear screen a 401 brings up: the key is kept in memory unless "remember" is ticked. */
export function KeyPrompt() {
  const session = useSession();
  const [key, setKey] = useState("");
  const [remember, setRemember] = useState(false);
  const [tried, setTried] = useState(false);
  const input = useRef<HTMLInputElement>(null);
  useEffect(() => input.current?.focus(), []);
  return (
    <div className="overlay">
      <div className="dialog" role="dialog" aria-modal="true" aria-labelledby="key-title" data-testid="key-prompt">
        <h2 id="key-title">API key required</h2>
        <p>
          The server at <code>{session.conn.baseUrl}</code> asks for an API key
          {session.detail ? (
            <>
              : <q data-testid="key-error">{session.detail}</q>
            </>
          ) : (
            "."
          )}
        </p>
        {tried && session.conn.apiKey && <p className="error" role="alert">That key was refused. Check it and try again.</p>}
        <form
          onSubmit={(e) => {
            e.preventDefault();
            setTried(true);
            session.setKey(key.trim(), remember);
          }}
        >
          <label htmlFor="api-key">API key</label>
          <input
            id="api-key"
            ref={input}
            type="password"
            autoComplete="off"
            value={key}
            onChange={(e) => setKey(e.target.value)}
          />
          <label className="check">
            <input type="checkbox" checked={remember} onChange={(e) => setRemember(e.target.checked)} />
            Remember on this device (stored in this browser's local storage)
          </label>
          <div className="row">
            <button type="submit" className="primary" disabled={!key.trim()} data-testid="key-submit">
              Connect
            </button>
          </div>
        </form>
        <p className="muted">Without “remember”, the key lives only in this tab’s memory and is gone on reload.</p>
      </div>
    </div>
  );
}
