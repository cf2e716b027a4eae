//! The demo's progress: a live line on a terminal, plain lines otherwise.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// Shows progress: a live line on a terminal, plain lines otherwise.
pub struct Progress {
    bar: Option<ProgressBar>,
    last_line: Mutex<Instant>,
}

impl Progress {
    pub fn new() -> Self {
        let bar = std::io::stdout().is_terminal().then(|| {
            let b = ProgressBar::new_spinner();
            if let Ok(style) = ProgressStyle::with_template("{spinner} {msg}") {
                b.set_style(style);
            }
            b.enable_steady_tick(Duration::from_millis(120));
            b
        });
        Progress { bar, last_line: Mutex::new(Instant::now()) }
    }

    pub fn update(&self, msg: String) {
        match &self.bar {
            Some(b) => b.set_message(msg),
            None => {
                let mut last = self.last_line.lock().unwrap_or_else(|e| e.into_inner());
                if last.elapsed() >= Duration::from_secs(1) {
                    println!("  {msg}");
                    *last = Instant::now();
                }
            }
        }
    }

    pub fn line(&self, msg: String) {
        match &self.bar {
            Some(b) => b.println(msg),
            None => println!("{msg}"),
        }
    }

    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
