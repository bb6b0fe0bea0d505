//! `powerfs BACKING MOUNTPOINT`: mount powerfs and take commands from stdin, one a
//! line: `power-loss`, `power-loss-torn SEED`, `status`, `quit`. Reproduce crash tests
//! by hand: run the program under test on MOUNTPOINT, kill it, type `power-loss`.

use std::io::{self, BufRead, Write};
use std::path::Path;

use permitd_powerfs::PowerFs;

fn main() -> io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        eprintln!("usage: powerfs BACKING MOUNTPOINT  (then stdin: power-loss | power-loss-torn SEED | status | quit)");
        std::process::exit(2);
    }
    let fs = PowerFs::mount(Path::new(&args[1]), Path::new(&args[2]))?;
    println!("mounted {} on {}", args[1], fs.mountpoint().display());
    let mut out = io::stdout();
    out.flush()?;
    for line in io::stdin().lock().lines() {
        let line = line?;
        let words: Vec<&str> = line.split_whitespace().collect();
        let res = match words.as_slice() {
            [] => continue,
            ["quit"] => break,
            ["status"] => {
                let (bytes, ops) = fs.unsynced();
                writeln!(out, "unsynced: {bytes} undo bytes, {ops} namespace ops")?;
                Ok(())
            }
            ["power-loss"] => fs.power_loss(None).map(|r| println!("{r}")),
            ["power-loss-torn", seed] => match seed.parse::<u64>() {
                Ok(seed) => fs.power_loss(Some(seed)).map(|r| println!("{r}")),
                Err(_) => {
                    println!("error: SEED must be a number");
                    Ok(())
                }
            },
            _ => {
                println!(
                    "unknown command: {line} (power-loss | power-loss-torn SEED | status | quit)"
                );
                Ok(())
            }
        };
        if let Err(e) = res {
            println!("error: {e}");
        }
        out.flush()?;
    }
    fs.unmount()
}
