//! speech-dispatcher (the Linux speech server that Orca and `spd-say` talk to) speaking through
//! cosy: an output module named `cosy`, made of speech-dispatcher's own generic module
//! (`sd_generic`) and a configuration that runs `cosy say` for each message.
//!
//! Why the generic module and not a module of our own: speech-dispatcher's generic module runs
//! one command per message in a process group of its own and, on STOP or CANCEL, kills that group
//! (SIGKILL), so the sound stops at once, whatever cosy is doing: exactly what a screen reader
//! needs. The latency is a process start plus `cosy say`'s first audio, which a warm local
//! server makes short (docs/desktop.md). Pause is not offered by the generic module
//! (speech-dispatcher stops the message instead), and it passes no audio back to
//! speech-dispatcher: `cosy say` plays on the user's sound output itself.
//!
//! Installing (no system file is touched, every other module stays as it was):
//! * `$XDG_CONFIG_HOME/speech-dispatcher/modules/cosy.conf`: the configuration printed by
//!   `cosy speech-dispatcher config` (the saved voices as speech-dispatcher's voices).
//! * `$XDG_DATA_HOME/../libexec/speech-dispatcher-modules/sd_cosy`: a link to `sd_generic`;
//!   speech-dispatcher discovers user modules there by name (`sd_NAME` reads `NAME.conf`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use cosy::app::voices::Voices;
use cosy::config::Config;


/// The module's name: `spd-say -o cosy`.
pub const MODULE: &str = "cosy";

/// The languages each saved voice is offered in: CosyVoice3's (every voice speaks each of them).
const LANGUAGES: &[&str] = &["en", "zh", "ja", "ko", "de", "es", "fr", "it", "ru"];

/// speech-dispatcher's symbolic voice types, given to the saved voices in turn (`spd-say -t`).
const VOICE_TYPES: &[&str] = &["FEMALE1", "MALE1", "FEMALE2", "MALE2", "FEMALE3", "MALE3", "CHILD_FEMALE", "CHILD_MALE"];

/// Where Debian, Fedora and a source build put `sd_generic`.
const GENERIC_DIRS: &[&str] = &[
    "/usr/lib/speech-dispatcher-modules",
    "/usr/libexec/speech-dispatcher-modules",
    "/usr/lib64/speech-dispatcher-modules",
    "/usr/local/libexec/speech-dispatcher-modules",
    "/usr/local/lib/speech-dispatcher-modules",
];

/// `cosy speech-dispatcher config`: the module's configuration on standard output.
pub fn print_config(config: &Config) -> Result<()> {
    print!("{}", module_config(config, &current_exe()?)?);
    Ok(())
}

/// `cosy speech-dispatcher install`: the module in the user's folders (`config_dir`: another
/// speech-dispatcher folder).
pub fn install_for_user(config: &Config, config_dir: Option<&Path>) -> Result<()> {
    let conf = module_config(config, &current_exe()?)?;
    let config_dir = config_dir.map(Path::to_path_buf).unwrap_or_else(default_config_dir);
    let (conf_path, link) = install(&conf, &config_dir, &user_module_dir(), &find_generic()?)?;
    println!("speech-dispatcher module `{MODULE}`: {} and {}", conf_path.display(), link.display());
    println!("restart speech-dispatcher (`killall speech-dispatcher`; it starts again on use), then: spd-say -o {MODULE} \"Hello\"");
    Ok(())
}

/// `cosy speech-dispatcher remove`: the module's two files, where they are.
pub fn remove_for_user() -> Result<()> {
    for path in [default_config_dir().join("modules").join(format!("{MODULE}.conf")), user_module_dir().join(format!("sd_{MODULE}"))] {
        match std::fs::remove_file(&path) {
            Ok(()) => println!("removed {}", path.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("cannot remove {}", path.display())),
        }
    }
    Ok(())
}

fn current_exe() -> Result<PathBuf> {
    std::env::current_exe().context("the cosy executable's path")
}

/// The user's speech-dispatcher folder.
fn default_config_dir() -> PathBuf {
    xdg("XDG_CONFIG_HOME", ".config").join("speech-dispatcher")
}

/// Where speech-dispatcher looks for a user's modules: `$XDG_DATA_HOME/../libexec/…`.
fn user_module_dir() -> PathBuf {
    let data = xdg("XDG_DATA_HOME", ".local/share");
    data.parent().unwrap_or(&data).join("libexec/speech-dispatcher-modules")
}

/// `$VAR`, else `~/DEFAULT`.
fn xdg(var: &str, default: &str) -> PathBuf {
    match std::env::var_os(var) {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(default),
    }
}

/// speech-dispatcher's generic module.
fn find_generic() -> Result<PathBuf> {
    GENERIC_DIRS.iter().map(|d| Path::new(d).join("sd_generic")).find(|p| p.is_file()).ok_or_else(|| {
        anyhow::anyhow!(
            "speech-dispatcher's generic module (sd_generic) is not in {}: install speech-dispatcher (Debian/Ubuntu: apt install speech-dispatcher)",
            GENERIC_DIRS.join(", ")
        )
    })
}

/// The module's configuration for the voices of `config`, running the cosy executable `cosy`.
pub fn module_config(config: &Config, cosy: &Path) -> Result<String> {
    let cosy_path = cosy.to_str().filter(|p| !p.contains(['\'', '"', '\\', '\n'])).with_context(|| {
        format!("the cosy executable's path {} has a quote, a backslash or a newline: install cosy where its path has none", cosy.display())
    })?;
    let voices = Voices::new(config);
    let names: Vec<String> = voices.list(None)?.into_iter().filter(|e| e.voice.is_ok()).map(|e| e.name).collect();
    let default = voices.default_voice()?.map(|(n, _)| n).filter(|n| names.contains(n)).or_else(|| names.first().cloned());
    let mut c = String::new();
    let _ = writeln!(c, "# speech-dispatcher output module `{MODULE}`: speech-dispatcher's generic module running `cosy say`");
    let _ = writeln!(c, "# (docs/desktop.md). Written by `cosy speech-dispatcher install`; run it again after adding or");
    let _ = writeln!(c, "# removing voices. Stop and cancel kill the command's process group, which stops the sound at once.");
    let _ = writeln!(c, "Debug 0");
    // $DATA arrives with every ' written as '\'' (speech-dispatcher's own escaping), so it is
    // safe between single quotes; voice names are cosy's (letters, digits, - and _).
    // With no saved voice yet, `cosy say` speaks with the default voice once there is one.
    let voice = if names.is_empty() { "" } else { "--voice \\'$VOICE\\' " };
    if names.is_empty() {
        let _ = writeln!(c, "# No saved voice yet ({}): cosy says with its default voice once one is saved.", config.voices.dir.display());
    }
    let _ = writeln!(c, "GenericExecuteSynth \"\\'{cosy_path}\\' say -q {voice}--speed $RATE -- \\'$DATA\\'\"");
    // speech-dispatcher's rate -100..100 as cosy's speed 0.5..1.5 (printed with two decimals:
    // rate 0 is speed 1.00, which streams).
    let _ = writeln!(c, "GenericRateAdd 1");
    let _ = writeln!(c, "GenericRateMultiply 0.005");
    // One command per message, however long: cosy splits sentences itself, and each command
    // pays a process start.
    let _ = writeln!(c, "GenericMaxChunkLength 100000");
    for lang in LANGUAGES {
        for (i, name) in names.iter().enumerate() {
            let _ = writeln!(c, "AddVoice \"{lang}\" \"{}\" \"{name}\"", VOICE_TYPES[i % VOICE_TYPES.len()]);
        }
    }
    if let Some(default) = default {
        let _ = writeln!(c, "DefaultVoice \"{default}\"");
    }
    Ok(c)
}

/// Writes `conf` as `config_dir/modules/cosy.conf` and links `module_dir/sd_cosy` to `generic`;
/// returns both paths. Each file is replaced whole (written beside, then renamed).
pub fn install(conf: &str, config_dir: &Path, module_dir: &Path, generic: &Path) -> Result<(PathBuf, PathBuf)> {
    let modules = config_dir.join("modules");
    std::fs::create_dir_all(&modules).with_context(|| format!("cannot create {}", modules.display()))?;
    let conf_path = modules.join(format!("{MODULE}.conf"));
    // Through fsx: replaced whole, and a failure names the final path and the fix, never a temp.
    cosy::fsx::Dest::new(&conf_path, "the speech-dispatcher module config").write(conf.as_bytes())?;
    std::fs::create_dir_all(module_dir).with_context(|| format!("cannot create {}", module_dir.display()))?;
    let link = module_dir.join(format!("sd_{MODULE}"));
    let link_dest = cosy::fsx::Dest::new(&link, "the speech-dispatcher module link");
    let tmp_link = link_dest.temp_path();
    std::os::unix::fs::symlink(generic, &tmp_link).map_err(|e| link_dest.error(e))?;
    if let Err(e) = std::fs::rename(&tmp_link, &link) {
        let _ = std::fs::remove_file(&tmp_link);
        return Err(link_dest.error(e).into());
    }
    Ok((conf_path, link))
}
