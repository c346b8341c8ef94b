"""`lantern menubar`: a status-bar / tray launcher for the server (controller + tray)."""
