// The page: an API token (kept in localStorage), the agent's stored conversation as the chat's
// initial messages, then the chat itself. `?type=Chat&agent=demo` names the agent.
import { useEffect, useState } from "react";
import { Chat } from "./Chat.jsx";

const query = new URLSearchParams(window.location.search);
const agentType = query.get("type") ?? "Chat";
const agentName = query.get("agent") ?? "demo";
const TOKEN_KEY = "think-jobs-token";

async function storedMessages(token) {
  const path = `${encodeURIComponent(agentType)}/${encodeURIComponent(agentName)}`;
  const response = await fetch(`/api/agents/${path}/messages`, {
    headers: { Authorization: `Bearer ${token}` },
  });
  if (!response.ok) throw new Error(`loading the conversation: HTTP ${response.status}`);
  return (await response.json()).messages;
}

function TokenForm({ onToken }) {
  const [value, setValue] = useState("");
  const submit = (event) => {
    event.preventDefault();
    if (value.trim()) onToken(value.trim());
  };
  return (
    <form className="token" onSubmit={submit}>
      <label htmlFor="token">API token</label>
      <input id="token" type="password" value={value} onChange={(e) => setValue(e.target.value)} />
      <button type="submit">Open the chat</button>
    </form>
  );
}

export function App() {
  const [token, setToken] = useState(() => window.localStorage.getItem(TOKEN_KEY));
  const [initialMessages, setInitialMessages] = useState(null);
  const [problem, setProblem] = useState(null);
  useEffect(() => {
    if (token) storedMessages(token).then(setInitialMessages, (e) => setProblem(e.message));
  }, [token]);
  const remember = (value) => {
    window.localStorage.setItem(TOKEN_KEY, value);
    setToken(value);
  };
  return (
    <main>
      <h1>
        {agentType} <span className="name">{agentName}</span>
      </h1>
      {!token && <TokenForm onToken={remember} />}
      {problem && <p role="alert">{problem}</p>}
      {token && initialMessages && (
        <Chat
          agentType={agentType}
          agentName={agentName}
          token={token}
          initialMessages={initialMessages}
        />
      )}
      <footer>
        AI SDK <span id="sdk-version">{__AI_SDK_VERSION__}</span>
      </footer>
    </main>
  );
}
