from .cli import main

if __name__ == "__main__":  # not when the writer process imports this module
    main()
