// The Penrose (.pen) extension: starts `penrose lsp` (pip install 'penrose-diagrams[editor]')
// and connects VS Code to it; highlighting comes from syntaxes/penrose.tmLanguage.json.
"use strict";

const vscode = require("vscode");
const { LanguageClient } = require("vscode-languageclient/node");

let client;

function activate(context) {
  const config = vscode.workspace.getConfiguration("penrose");
  const [command, ...args] = config.get("server.command", ["penrose", "lsp"]);
  for (const folder of config.get("includePaths", [])) {
    args.push("--include-path", folder);
  }
  const serverOptions = { command, args };
  const clientOptions = {
    documentSelector: [
      { scheme: "file", language: "pen" },
      { scheme: "untitled", language: "pen" },
    ],
    // included files changed by other programs (git checkout, another editor) are re-checked
    synchronize: { fileEvents: vscode.workspace.createFileSystemWatcher("**/*.pen") },
  };
  client = new LanguageClient("penrose", "Penrose language server", serverOptions, clientOptions);
  context.subscriptions.push({ dispose: () => client && client.stop() });
  return client.start();
}

function deactivate() {
  return client ? client.stop() : undefined;
}

module.exports = { activate, deactivate };
