export type Theme = "light" | "dark";
const STORE = "colibri.theme";

export function initialTheme(): Theme {
  try {
    const saved = localStorage.getItem(STORE);
    if (saved === "light" || saved === "dark") return saved;
  } catch {
    /* storage disabled */
  }
  return window.matchMedia?.("(prefers-color-scheme: dark)").matches ? "dark" : "light";
}

export function applyTheme(theme: Theme, persist: boolean): void {
  document.documentElement.dataset.theme = theme;
  if (!persist) return;
  try {
    localStorage.setItem(STORE, theme);
  } catch {
    /* storage disabled */
  }
}
