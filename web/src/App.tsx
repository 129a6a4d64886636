import { useEffect, useState } from "react";
import { KeyPrompt } from "./components/KeyPrompt";
import { StatusBar } from "./components/StatusBar";
import { Brain } from "./pages/Brain";
import { Chat } from "./pages/Chat";
import { Profiling } from "./pages/Profiling";
import { Settings } from "./pages/Settings";
import { SystemOne } from "./pages/SystemOne";
import { SessionProvider, useSession } from "./session";
import { applyTheme, initialTheme, type Theme } from "./theme";

export const PAGES = [
  { id: "chat", path: "/chat", label: "Chat" },
  { id: "systemone", path: "/systemone", label: "System One" },
  { id: "brain", path: "/brain", label: "Brain" },
  { id: "profiling", path: "/profiling", label: "Profiling" },
  { id: "settings", path: "/settings", label: "Settings" },
] as const;
type PageId = (typeof PAGES)[number]["id"];

function pageFromPath(path: string): PageId {
  return PAGES.find((p) => p.path === path.replace(/\/+$/, ""))?.id ?? "chat";
}

function Shell() {
  const session = useSession();
  const [page, setPage] = useState<PageId>(() => pageFromPath(window.location.pathname));
  const [theme, setTheme] = useState<Theme>(initialTheme);

  useEffect(() => applyTheme(theme, false), [theme]);
  useEffect(() => {
    const on = () => setPage(pageFromPath(window.location.pathname));
    window.addEventListener("popstate", on);
    return () => window.removeEventListener("popstate", on);
  }, []);

  const go = (id: PageId) => {
    const p = PAGES.find((x) => x.id === id)!;
    if (window.location.pathname !== p.path) window.history.pushState(null, "", p.path);
    setPage(id);
  };
  const toggleTheme = () => {
    const next: Theme = theme === "dark" ? "light" : "dark";
    applyTheme(next, true);
    setTheme(next);
  };

  return (
    <div className="app">
      <header className="topbar">
        <div className="brand" aria-label="colibri dashboard">
          <span className="brand-mark" aria-hidden="true">◆</span> colibri
        </div>
        <nav className="dock" aria-label="Pages">
          {PAGES.map((p) => (
            <a
              key={p.id}
              href={p.path}
              className={page === p.id ? "dock-item active" : "dock-item"}
              aria-current={page === p.id ? "page" : undefined}
              data-page={p.id}
              onClick={(e) => {
                if (e.metaKey || e.ctrlKey || e.shiftKey || e.button !== 0) return;
                e.preventDefault();
                go(p.id);
              }}
            >
              {p.label}
            </a>
          ))}
        </nav>
        <button
          type="button"
          className="theme-toggle"
          onClick={toggleTheme}
          aria-label={theme === "dark" ? "Switch to light theme" : "Switch to dark theme"}
          data-testid="theme-toggle"
        >
          {theme === "dark" ? "☀ Light" : "☾ Dark"}
        </button>
      </header>
      <main className="page" id="main">
        {/* Chat stays mounted so a reply keeps streaming while another page is open. */}
        <div hidden={page !== "chat"}>
          <Chat />
        </div>
        {page === "systemone" && <SystemOne />}
        {page === "brain" && <Brain />}
        {page === "profiling" && <Profiling />}
        {page === "settings" && <Settings theme={theme} onToggleTheme={toggleTheme} />}
      </main>
      <StatusBar />
      {session.state === "unauthorized" && <KeyPrompt />}
    </div>
  );
}

export function App() {
  return (
    <SessionProvider>
      <Shell />
    </SessionProvider>
  );
}
