fn main() {
    eprintln!("cosy: not yet implemented");
    std::process::exit(1);
}
